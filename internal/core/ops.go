package core

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtransport/pgtransport"
)

// What an operator sees and steers (schema version 11): Stats, the groups,
// a group's next messages, and pause, resume and purge of one group. Each
// call checks its arguments first (a bad one is a typed error and no
// round-trip), then is one round-trip and one transaction. A group's
// state, LeasedAt and Until are by the clock the claims use (the injected
// clock's, else the database server's); ages and Stats.At are by the
// server's clock, as the messages' publish times are.

// Stats reads the queue at a glance (harel_stats): group counts per state
// and priority, message and dead-letter counts and the oldest head's age
// (each exact, or an estimate as its Exact field says), and the idle
// consumers waiting. A read.
func (c *Core) Stats(ctx context.Context) (pgtransport.Stats, error) {
	if err := ctx.Err(); err != nil {
		return pgtransport.Stats{}, fmt.Errorf("stats: %w", err)
	}
	rows, err := c.db.Query(ctx, c.q.stats, c.now())
	if err != nil {
		return pgtransport.Stats{}, mapErr("stats", err)
	}
	defer rows.Close()
	var (
		s     pgtransport.Stats
		total bool
	)
	for rows.Next() {
		var (
			p        pgtransport.PriorityStats
			priority *int32
			age      *float64
			waiters  int64
			at       time.Time
		)
		if err := rows.Scan(&priority, &p.Groups, &p.Free, &p.Leased, &p.Parked, &p.Stopped, &p.Paused,
			&p.Messages, &p.MessagesExact, &age, &p.OldestHeadExact, &p.DeadLetters, &p.DeadLettersExact,
			&waiters, &at, &p.GroupsExact); err != nil {
			return pgtransport.Stats{}, mapErr("stats", err)
		}
		p.OldestHeadAge = seconds(age)
		s.At = at
		if priority == nil {
			p.Priority = -1
			s.Total, s.Waiting, total = p, waiters, true
			continue
		}
		p.Priority = int(*priority)
		s.ByPriority = append(s.ByPriority, p)
	}
	if err := rows.Err(); err != nil {
		return pgtransport.Stats{}, mapErr("stats", err)
	}
	if !total || len(s.ByPriority) != pgtransport.MaxPriority-pgtransport.MinPriority+1 {
		return pgtransport.Stats{}, fmt.Errorf("stats: harel_stats answered %d priority rows (total row: %t), want %d and one", len(s.ByPriority), total, pgtransport.MaxPriority-pgtransport.MinPriority+1)
	}
	return s, nil
}

// Groups returns a page of groups (harel_groups): those in q.State (""
// every state) of q.Tenant ("" every tenant), in q.Order, skipping
// q.Offset, at most q.Limit (0: DefaultGroupLimit). ErrInvalidQuery for
// an unknown State or Order or a negative Offset or Limit,
// ErrInvalidBatch for a Limit past MaxBatch, ErrInvalidTenant for a
// tenant over MaxTenantBytes, not valid UTF-8 or with a NUL, all with no
// round-trip. A read; pages taken one after another may
// overlap or skip groups whose state or order changed in between.
func (c *Core) Groups(ctx context.Context, q pgtransport.GroupQuery) ([]pgtransport.GroupInfo, error) {
	if err := checkGroupQuery(q); err != nil {
		return nil, fmt.Errorf("groups: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("groups: %w", err)
	}
	var state *string
	if q.State != "" {
		s := string(q.State)
		state = &s
	}
	var tenant *string
	if q.Tenant != "" {
		tenant = &q.Tenant
	}
	order := string(cmp.Or(q.Order, pgtransport.ByGroup))
	rows, err := c.db.Query(ctx, c.q.groups, c.now(), state, order, q.Offset, cmp.Or(q.Limit, pgtransport.DefaultGroupLimit), tenant)
	if err != nil {
		return nil, mapErr("groups", err)
	}
	defer rows.Close()
	var out []pgtransport.GroupInfo
	for rows.Next() {
		g, err := scanGroup(rows)
		if err != nil {
			return nil, mapErr("groups", err)
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, mapErr("groups", err)
	}
	return out, nil
}

// Group returns one group as Groups shows it (harel_group).
// ErrUnknownGroup if the group has no row; ErrInvalidGroup for an id no
// database holds, with no round-trip. A read.
func (c *Core) Group(ctx context.Context, group string) (pgtransport.GroupInfo, error) {
	if err := checkStoredGroup(group); err != nil {
		return pgtransport.GroupInfo{}, fmt.Errorf("group: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return pgtransport.GroupInfo{}, fmt.Errorf("group: %w", err)
	}
	g, err := scanGroup(c.db.QueryRow(ctx, c.q.group, c.now(), group))
	if err != nil {
		return pgtransport.GroupInfo{}, mapErr("group", err)
	}
	return g, nil
}

// Peek returns the group's next n messages (1 to MaxBatch, else
// ErrInvalidBatch), head first, without leasing them: nothing changes,
// and a claim afterwards hands out the head as if Peek had not run.
// ErrUnknownGroup if the group has neither a row nor a message;
// ErrInvalidGroup as Group.
func (c *Core) Peek(ctx context.Context, group string, n int) ([]pgtransport.PeekedMessage, error) {
	if err := checkStoredGroup(group); err != nil {
		return nil, fmt.Errorf("peek: %w", err)
	}
	if n < 1 || n > pgtransport.MaxBatch {
		return nil, fmt.Errorf("peek: %w: n %d, want 1 to %d", pgtransport.ErrInvalidBatch, n, pgtransport.MaxBatch)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("peek: %w", err)
	}
	rows, err := c.db.Query(ctx, c.q.peek, group, n)
	if err != nil {
		return nil, mapErr("peek", err)
	}
	defer rows.Close()
	var out []pgtransport.PeekedMessage
	for rows.Next() {
		var (
			m         pgtransport.PeekedMessage
			published *time.Time
			lastError *string
		)
		if err := rows.Scan(&m.Seq, &m.Event, &published, &lastError); err != nil {
			return nil, mapErr("peek", err)
		}
		if published != nil {
			m.PublishedAt = *published
		}
		if lastError != nil {
			m.LastError = *lastError
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, mapErr("peek", err)
	}
	return out, nil
}

// PauseGroup pauses group (harel_pause_group): no claim of any kind hands
// it out until ResumeGroup, and its row stays while it drains. A holder
// mid-message keeps its lease and may settle it, but the group is not
// kept for it nor claimed afterwards. Idempotent. ErrUnknownGroup if the
// group has no row; ErrInvalidGroup as Group.
func (c *Core) PauseGroup(ctx context.Context, group string) error {
	_, err := c.groupSwitch(ctx, "pause group", c.q.pause, group)
	return err
}

// ResumeGroup puts a paused group back into the round-robin, or deletes
// its row if it drained while paused (harel_resume_group, which wakes
// idle consumers by notification; this
// core's parked callers are woken too). Idempotent. ErrUnknownGroup if the
// group has no row; ErrInvalidGroup as Group.
func (c *Core) ResumeGroup(ctx context.Context, group string) error {
	changed, err := c.groupSwitch(ctx, "resume group", c.q.resume, group)
	if changed {
		c.parking.Wake(1)
	}
	return err
}

// groupSwitch runs a statement that takes a group and answers whether it
// changed anything.
func (c *Core) groupSwitch(ctx context.Context, op, sql, group string) (bool, error) {
	if err := checkStoredGroup(group); err != nil {
		return false, fmt.Errorf("%s: %w", op, err)
	}
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("%s: %w", op, err)
	}
	var changed bool
	if err := c.db.QueryRow(ctx, sql, group).Scan(&changed); err != nil {
		return false, mapErr(op, err)
	}
	return changed, nil
}

// PurgeGroup deletes up to limit of group's oldest messages (0: all; else
// ErrInvalidBatch for a negative one) and returns how many
// (harel_purge_group). It ends any lease, park or stop on the group: a
// holder's later Ack, Nack, Extend or Fail gets ErrLeaseLost. Messages
// published after it commits are untouched. ErrUnknownGroup if the group
// has no row; ErrInvalidGroup as Group. When it left messages behind the
// group is claimable at once, and this core's parked callers are woken.
func (c *Core) PurgeGroup(ctx context.Context, group string, limit int) (int64, error) {
	if err := checkStoredGroup(group); err != nil {
		return 0, fmt.Errorf("purge group: %w", err)
	}
	if limit < 0 || limit > math.MaxInt32 {
		return 0, fmt.Errorf("purge group: %w: limit %d, want 0 (all) to %d", pgtransport.ErrInvalidBatch, limit, math.MaxInt32)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("purge group: %w", err)
	}
	var max *int32
	if limit > 0 {
		l := int32(limit)
		max = &l
	}
	var n int64
	if err := c.db.QueryRow(ctx, c.q.purgeGroup, c.now(), group, max).Scan(&n); err != nil {
		return 0, mapErr("purge group", err)
	}
	if n > 0 {
		c.parking.Wake(1)
	}
	return n, nil
}

// checkGroupQuery refuses a query harel_groups would refuse, before the
// round-trip.
func checkGroupQuery(q pgtransport.GroupQuery) error {
	switch q.State {
	case "", pgtransport.GroupFree, pgtransport.GroupLeased, pgtransport.GroupParked, pgtransport.GroupStopped, pgtransport.GroupPaused:
	default:
		return fmt.Errorf("%w: State %q", pgtransport.ErrInvalidQuery, q.State)
	}
	switch q.Order {
	case "", pgtransport.ByGroup, pgtransport.OldestHead, pgtransport.HeldLongest, pgtransport.MostAttempts:
	default:
		return fmt.Errorf("%w: Order %q", pgtransport.ErrInvalidQuery, q.Order)
	}
	if err := CheckTenant(q.Tenant, true); err != nil {
		return err
	}
	switch {
	case q.Offset < 0 || q.Offset > math.MaxInt32:
		return fmt.Errorf("%w: Offset %d, want 0 to %d", pgtransport.ErrInvalidQuery, q.Offset, math.MaxInt32)
	case q.Limit < 0:
		return fmt.Errorf("%w: Limit %d, want 0 (%d) to %d", pgtransport.ErrInvalidQuery, q.Limit, pgtransport.DefaultGroupLimit, pgtransport.MaxBatch)
	case q.Limit > pgtransport.MaxBatch:
		return fmt.Errorf("%w: Limit %d, want 0 (%d) to %d", pgtransport.ErrInvalidBatch, q.Limit, pgtransport.DefaultGroupLimit, pgtransport.MaxBatch)
	}
	return nil
}

// scanner is a pgx.Row or pgx.Rows.
type scanner interface{ Scan(dest ...any) error }

// scanGroup reads one row of harel_groups or harel_group.
func scanGroup(r scanner) (pgtransport.GroupInfo, error) {
	var (
		g                        pgtransport.GroupInfo
		state                    string
		holder                   *string
		leasedAt, until, headAge *float64
		headSeq                  *int64
		priority, attempts       int32
	)
	if err := r.Scan(&g.Group, &priority, &state, &holder, &leasedAt, &until, &headSeq, &headAge, &attempts, &g.Tenant); err != nil {
		return g, err
	}
	g.Priority, g.State, g.Attempts = int(priority), pgtransport.GroupState(state), int(attempts)
	if holder != nil {
		g.Holder = *holder
	}
	g.LeasedAt, g.Until = epochTime(leasedAt), epochTime(until)
	if headSeq != nil {
		g.HeadSeq = *headSeq
	}
	g.HeadAge = seconds(headAge)
	return g, nil
}

// epochTime is epoch seconds as a time: zero for NULL or an infinity (a
// stopped group's Until).
func epochTime(s *float64) time.Time {
	if s == nil || math.IsInf(*s, 0) || math.IsNaN(*s) {
		return time.Time{}
	}
	sec, frac := math.Modf(*s)
	return time.Unix(int64(sec), int64(math.Round(frac*1e9)))
}

// seconds is a duration in seconds as a Duration: 0 for NULL.
func seconds(s *float64) time.Duration {
	if s == nil || math.IsNaN(*s) || math.IsInf(*s, 0) {
		return 0
	}
	return time.Duration(*s * float64(time.Second))
}

// SetTenantWeight sets tenant's weight (harel_set_tenant_weight): an
// empty or bad tenant is ErrInvalidTenant, a weight outside 1 to
// MaxTenantWeight ErrInvalidWeight, with no round-trip.
func (c *Core) SetTenantWeight(ctx context.Context, tenant string, weight int) error {
	if err := cmp.Or(CheckTenant(tenant, false), CheckWeight(weight)); err != nil {
		return fmt.Errorf("set tenant weight: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("set tenant weight: %w", err)
	}
	if _, err := c.db.Exec(ctx, c.q.setWeight, tenant, weight); err != nil {
		return mapErr("set tenant weight", err)
	}
	return nil
}

// Tenants lists the tenants (harel_tenants), in tenant order.
func (c *Core) Tenants(ctx context.Context) ([]pgtransport.TenantInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("tenants: %w", err)
	}
	rows, err := c.db.Query(ctx, c.q.tenants, c.now())
	if err != nil {
		return nil, mapErr("tenants", err)
	}
	var (
		ti  pgtransport.TenantInfo
		w   int32
		out []pgtransport.TenantInfo
	)
	_, err = pgx.ForEachRow(rows, []any{&ti.Tenant, &w, &ti.Groups, &ti.Leased, &ti.Ready, &ti.Delivered}, func() error {
		ti.Weight = int(w)
		out = append(out, ti)
		return nil
	})
	if err != nil {
		return nil, mapErr("tenants", err)
	}
	Shares(out)
	return out, nil
}

// Shares sets each tenant's Share: its weight over the weights of the
// tenants with Ready > 0 (0 with none).
func Shares(ts []pgtransport.TenantInfo) {
	var sum int
	for _, t := range ts {
		if t.Ready > 0 {
			sum += t.Weight
		}
	}
	for i := range ts {
		ts[i].Share = 0
		if ts[i].Ready > 0 {
			ts[i].Share = float64(ts[i].Weight) / float64(sum)
		}
	}
}
