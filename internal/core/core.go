// Package core is the one implementation behind package sync and package
// async: argument checks, the statements, error mapping, and the
// publish/claim/ack/nack/extend calls. Front-ends add only their calling
// convention.
package core

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/schema"
)

// DBTX is what the core sends statements through: a *pgxpool.Pool, a
// *pgx.Conn or a pgx.Tx. A *pgx.Conn serves one goroutine at a time.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Core is safe for concurrent use when its DBTX is.
type Core struct {
	db       DBTX
	clock    func() time.Time
	maxEvent int
	q        statements
	cfg      pgtransport.Config
	parking  Parking // this core's idle callers; see wake.go for who wakes them
	pooled   bool    // db goes through a transaction pooler (CheckPooling)
}

// New checks cfg, fills its defaults, checks db's query exec mode against
// cfg.Pooling (CheckPooling: pgtransport.ErrPoolerExecMode behind a
// transaction pooler; skipped with cfg.SkipApply when the server cannot
// be reached), unless cfg.SkipApply applies the schema, and
// applies cfg.Policy when set (see SetPolicy), SkipApply or not.
func New(ctx context.Context, db DBTX, cfg pgtransport.Config) (*Core, error) {
	cfg, err := Defaults(cfg)
	if err != nil {
		return nil, err
	}
	if isNil(db) {
		return nil, fmt.Errorf("%w: nil database handle", pgtransport.ErrInvalidConfig)
	}
	pooled, err := CheckPooling(ctx, db, cfg)
	if err != nil && (!cfg.SkipApply || errors.Is(err, pgtransport.ErrPoolerExecMode) || errors.Is(err, pgtransport.ErrInvalidConfig)) {
		return nil, err
	}
	// With SkipApply a transport opens with no server to reach, as it
	// always could; the pooler check then has no answer, and is skipped.
	if !cfg.SkipApply {
		if err := schema.Apply(ctx, db, cfg.Schema); err != nil {
			return nil, mapErr("apply schema", withHint(err, "42501", "this role may not change the schema: apply it as the queue's owner (pgtransport migrate apply, or schema.Apply), and open workers with Config.SkipApply"))
		}
	} else if err := checkApplied(ctx, db, cfg.Schema); err != nil {
		return nil, err
	}
	q := newStatements(cfg.Schema, cfg.Clock != nil)
	if cfg.Policy != nil {
		if err := setPolicy(ctx, db, q, *cfg.Policy); err != nil {
			return nil, err
		}
	}
	if _, inTx := db.(pgx.Tx); inTx {
		q.claim = q.claimInTx // a caller's transaction keeps its own commit mode
	}
	return &Core{db: db, clock: cfg.Clock, maxEvent: cfg.MaxEventBytes, q: q, cfg: cfg, pooled: pooled}, nil
}

// conn returns what a claim sends its statement on, so that its lease's
// local Expiry counts from when the statement left (localExpiry): from a
// pool, a connection acquired now (done releases it), since waiting for
// one (a pool at its size, a connect to a host that hangs until its
// connect_timeout) may take longer than the visibility; otherwise c.db.
func (c *Core) conn(ctx context.Context) (DBTX, func(), error) {
	p, ok := c.db.(*pgxpool.Pool)
	if !ok {
		return c.db, func() {}, nil
	}
	conn, err := p.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	return conn, conn.Release, nil
}

// Pooled reports whether the database handle goes through a transaction
// pooler (CheckPooling, at New): nothing may rely on session state, and
// no notification arrives through it.
func (c *Core) Pooled() bool { return c.pooled }

// Defaults validates cfg and fills in the defaults its zero fields stand for.
func Defaults(cfg pgtransport.Config) (pgtransport.Config, error) {
	if err := schema.ValidateName(cfg.Schema); err != nil {
		return cfg, err
	}
	if cfg.MaxEventBytes < 0 || cfg.MaxConnectWait < 0 || cfg.IdleSweep < 0 {
		return cfg, fmt.Errorf("%w: MaxEventBytes, MaxConnectWait and IdleSweep must not be negative", pgtransport.ErrInvalidConfig)
	}
	if cfg.Async.Vacuum < 0 {
		return cfg, fmt.Errorf("%w: Async.Vacuum must not be negative", pgtransport.ErrInvalidConfig)
	}
	if cfg.MaxKeep < -1 {
		return cfg, fmt.Errorf("%w: MaxKeep %d, want -1 (never keep), 0 (default) or more", pgtransport.ErrInvalidConfig, cfg.MaxKeep)
	}
	if cfg.KeepWhileWaiting < 0 {
		return cfg, fmt.Errorf("%w: KeepWhileWaiting %d, want 0 (default) or more", pgtransport.ErrInvalidConfig, cfg.KeepWhileWaiting)
	}
	if cfg.Policy != nil {
		if err := CheckPolicy(*cfg.Policy); err != nil {
			return cfg, err
		}
	}
	if cfg.DedupWindow < 0 || cfg.DedupWindow > pgtransport.MaxDedupWindow {
		return cfg, fmt.Errorf("%w: DedupWindow %v, want 0 (%v) to %v", pgtransport.ErrInvalidConfig, cfg.DedupWindow, pgtransport.DefaultDedupWindow, pgtransport.MaxDedupWindow)
	}
	cfg.MaxEventBytes = cmp.Or(cfg.MaxEventBytes, pgtransport.DefaultMaxEventBytes)
	cfg.MaxConnectWait = cmp.Or(cfg.MaxConnectWait, pgtransport.DefaultMaxConnectWait)
	cfg.IdleSweep = cmp.Or(cfg.IdleSweep, pgtransport.DefaultIdleSweep)
	cfg.MaxKeep = cmp.Or(cfg.MaxKeep, pgtransport.DefaultMaxKeep)
	cfg.KeepWhileWaiting = cmp.Or(cfg.KeepWhileWaiting, pgtransport.DefaultKeepWhileWaiting)
	cfg.DedupWindow = cmp.Or(cfg.DedupWindow, pgtransport.DefaultDedupWindow)
	return cfg, nil
}

// Config returns the configuration with defaults filled in.
func (c *Core) Config() pgtransport.Config { return c.cfg }

// now is the injected clock's time as epoch seconds, or nil: the server's.
func (c *Core) now() *float64 {
	if c.clock == nil {
		return nil
	}
	s := epoch(c.clock())
	return &s
}

func epoch(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// Publish appends event to group, readying the group with priority if it
// is new, and wakes one parked caller.
func (c *Core) Publish(ctx context.Context, group, event string, priority int) (int64, error) {
	return c.PublishMessage(ctx, pgtransport.Message{Group: group, Event: event, Priority: priority})
}

// PublishMessage appends m (deduplicated by m.DedupKey, if set: a
// duplicate within Config.DedupWindow writes nothing and returns the
// first message's seq) and wakes one parked caller.
func (c *Core) PublishMessage(ctx context.Context, m pgtransport.Message) (int64, error) {
	t0 := c.timer()
	seq, err := c.publish(ctx, c.db, m)
	c.observePublished(t0, 1, err)
	c.parking.Wake(wakesPublish(1, err))
	return seq, err
}

// PublishTx is Publish inside the caller's transaction tx.
func (c *Core) PublishTx(ctx context.Context, tx pgx.Tx, group, event string, priority int) (int64, error) {
	return c.PublishMessageTx(ctx, tx, pgtransport.Message{Group: group, Event: event, Priority: priority})
}

// PublishMessageTx is PublishMessage inside the caller's transaction tx.
// It wakes nobody: the message is invisible until the caller commits,
// which the core does not see (async streams learn of it by notification,
// ClaimWait callers at their next look). A dedup key it stores is
// invisible until then too: a concurrent publish of the same key waits
// for the caller's transaction, and stores its own if that rolls back.
func (c *Core) PublishMessageTx(ctx context.Context, tx pgx.Tx, m pgtransport.Message) (int64, error) {
	t0 := c.timer()
	var (
		seq int64
		err = fmt.Errorf("publish: %w: nil transaction", pgtransport.ErrInvalidConfig)
	)
	if tx != nil {
		seq, err = c.publish(ctx, tx, m)
	}
	c.observePublished(t0, 1, err) // the caller's commit, or rollback, is not seen
	return seq, err
}

// publish appends m through db: the core's handle or a caller's
// transaction. A message with a dedup key goes through the keyed batch
// publish, a batch of one.
func (c *Core) publish(ctx context.Context, db DBTX, m pgtransport.Message) (int64, error) {
	if err := c.checkMessage(m); err != nil {
		return 0, fmt.Errorf("publish: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("publish: %w", err)
	}
	var row pgx.Row
	if m.DedupKey == "" {
		row = db.QueryRow(ctx, c.q.publish, m.Group, m.Event, m.Priority, tenantArg(m.Tenant))
	} else {
		var tenants []*string // NULL: the default tenant
		if m.Tenant != "" {
			tenants = []*string{&m.Tenant}
		}
		row = db.QueryRow(ctx, c.q.publishKeyed, []string{m.Group}, []string{m.Event}, []int32{int32(m.Priority)},
			[]string{m.DedupKey}, c.cfg.DedupWindow.Seconds(), tenants)
	}
	var seq int64
	if err := row.Scan(&seq); err != nil {
		return 0, mapErr("publish", err)
	}
	return seq, nil
}

// Claim leases the next claimable group at or above minPriority and returns
// its head, or nil when nothing is claimable.
func (c *Core) Claim(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	t0 := c.timer()
	l, err := c.claim(ctx, workerID, visibility, minPriority)
	if c.Observing() {
		n := 0
		if l != nil {
			n = 1
		}
		c.observeClaimed(t0, n, err)
	}
	return l, err
}

func (c *Core) claim(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	if err := CheckClaim(workerID, visibility, minPriority); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	token := NewToken(workerID)
	l := pgtransport.Lease{Token: token}
	db, done, err := c.conn(ctx)
	if err != nil {
		return nil, mapErr("claim", err)
	}
	defer done()
	sent := time.Now()
	var age *float64
	err = db.QueryRow(ctx, c.q.claim, c.now(), visibility.Seconds(), token, minPriority).
		Scan(&l.Group, &l.Seq, &l.Event, &l.Attempt, &age)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, mapErr("claim", err)
	}
	l.Expiry = localExpiry(sent, visibility)
	l.PublishedAt = localPublished(sent, age)
	return &l, nil
}

// localPublished is Lease.PublishedAt for a message whose age the server
// measured (nil: unknown) during a claim sent at sent, by this process's
// clock: sent less the age. The server measured the age when the claim
// reached it, after sent, so this is never later than the publish, and
// earlier by at most the claim's trip to the server.
func localPublished(sent time.Time, age *float64) time.Time {
	if age == nil {
		return time.Time{}
	}
	return sent.Add(-time.Duration(*age * float64(time.Second)))
}

// localExpiry is Lease.Expiry for a lease of visibility asked for at sent,
// by this process's clock. The server ends the lease visibility after the
// statement reaches it, which is after sent: so this is never later than
// the real end, however far the server's clock is from this one.
func localExpiry(sent time.Time, visibility time.Duration) time.Time {
	return sent.Add(visibility)
}

// Ack deletes the lease's message and frees its group, waking one parked
// caller.
func (c *Core) Ack(ctx context.Context, l *pgtransport.Lease) error {
	t0 := c.timer()
	if err := checkLease(l); err != nil {
		err = fmt.Errorf("ack: %w", err)
		c.observeAcked(t0, 1, err)
		return err
	}
	err := c.fenced(ctx, "ack", c.q.ack, l.Group, l.Seq, l.Token)
	c.observeAcked(t0, 1, err)
	c.lostIf("ack", l, err)
	c.parking.Wake(wakesSettle(err))
	return err
}

// Nack gives the lease back: parked for delay, or free at once when delay
// is 0. Either way it wakes one parked caller.
func (c *Core) Nack(ctx context.Context, l *pgtransport.Lease, delay time.Duration) error {
	if err := cmp.Or(checkLease(l), checkDelay(delay)); err != nil {
		return fmt.Errorf("nack: %w", err)
	}
	err := c.fenced(ctx, "nack", c.q.nack, l.Group, l.Token, delay.Seconds())
	c.lostIf("nack", l, err)
	c.parking.Wake(wakesSettle(err))
	return err
}

// FailOutcome is what a Fail did with the lease's message.
type FailOutcome string

const (
	FailRetry   FailOutcome = "retry"                    // parked for the queue's backoff; the message stays the head
	FailDead    FailOutcome = "dead"                     // moved to transport_dead_letters; the group goes on
	FailStopped FailOutcome = "stopped"                  // its attempts used, the group stopped (policy StopGroup)
	FailBuried  FailOutcome = "buried"                   // dead-lettered at once, as its cause asked (pgtransport.DeadLetterNow)
	FailSnoozed FailOutcome = pgtransport.OutcomeSnoozed // parked uncounted, as its cause asked (pgtransport.Snooze)
)

// Fail ends the lease as a failed attempt: it records cause's text
// (CauseText) on the message and, as the queue's policy says, parks the
// group for a backoff, dead-letters the message, or stops the group. A
// cause that is (or wraps) pgtransport.DeadLetterNow's dead-letters the
// message at once; pgtransport.Snooze's parks the group uncounted.
// ErrLeaseLost (nothing changed) when the lease no longer holds. Like a
// nack it wakes one parked caller.
func (c *Core) Fail(ctx context.Context, l *pgtransport.Lease, cause error) (FailOutcome, error) {
	t0 := c.timer()
	out, err := c.fail(ctx, l, cause)
	c.observeFailed(t0, l, out, cause, err)
	c.lostIf("fail", l, err)
	return out, err
}

func (c *Core) fail(ctx context.Context, l *pgtransport.Lease, cause error) (FailOutcome, error) {
	if err := checkLease(l); err != nil {
		return "", fmt.Errorf("fail: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("fail: %w", err)
	}
	var (
		out *string
		err error
	)
	snooze, bury := verdict(cause)
	switch {
	case snooze != nil:
		if err := checkDelay(snooze.Delay); err != nil {
			return "", fmt.Errorf("fail: snooze: %w", err)
		}
		out, err = c.fenceOutcome(ctx, c.q.snooze, FailSnoozed, l, snooze.Delay.Seconds())
	case bury != nil:
		out, err = c.fenceOutcome(ctx, c.q.deadLetter, FailBuried, l, CauseText(bury.Cause))
	default:
		err = c.db.QueryRow(ctx, c.q.fail, c.now(), l.Group, l.Seq, l.Token, CauseText(cause)).Scan(&out)
	}
	switch {
	case err != nil:
		err = mapErr("fail", err)
	case out == nil:
		err = fmt.Errorf("fail: %w", pgtransport.ErrLeaseLost)
	}
	c.parking.Wake(wakesSettle(err))
	if err != nil {
		return "", err
	}
	return FailOutcome(*out), nil
}

// verdict is what a Fail's cause asks for: pgtransport.Snooze's or
// DeadLetterNow's error, the outermost of the two in cause's chain (so
// DeadLetterNow(Snooze(d)) dead-letters); both nil for a plain error.
func verdict(cause error) (*pgtransport.SnoozeError, *pgtransport.DeadLetterError) {
	for e := cause; e != nil; e = errors.Unwrap(e) {
		switch v := e.(type) {
		case *pgtransport.SnoozeError:
			return v, nil
		case *pgtransport.DeadLetterError:
			return nil, v
		}
	}
	var (
		snooze *pgtransport.SnoozeError
		bury   *pgtransport.DeadLetterError
	)
	if errors.As(cause, &snooze) { // in a joined error: as errors.As finds it
		return snooze, nil
	}
	if errors.As(cause, &bury) {
		return nil, bury
	}
	return nil, nil
}

// fenceOutcome runs sql, a fenced settle of l's message answering whether
// the lease held, with arg, and answers outcome if it did, nil if not.
func (c *Core) fenceOutcome(ctx context.Context, sql string, outcome FailOutcome, l *pgtransport.Lease, arg any) (*string, error) {
	var held bool
	if err := c.db.QueryRow(ctx, sql, c.now(), l.Group, l.Seq, l.Token, arg).Scan(&held); err != nil || !held {
		return nil, err
	}
	out := string(outcome)
	return &out, nil
}

// Release gives back a lease nobody used: its group is free at once, first
// in line (as Nack with no delay), and the hand-out does not count as an
// attempt. ErrLeaseLost when it no longer holds. It wakes one parked
// caller.
func (c *Core) Release(ctx context.Context, l *pgtransport.Lease) error {
	if err := checkLease(l); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	err := c.held(ctx, "release", c.q.release, l.Group, l.Token)
	c.lostIf("release", l, err)
	c.parking.Wake(wakesSettle(err))
	return err
}

// ReleaseQuiet is Release of a lease that may never have been held: one
// claimed inside a transaction whose commit's outcome is unknown. Its
// fence frees the group if the commit applied and changes nothing
// otherwise; it reports no lost lease either way.
func (c *Core) ReleaseQuiet(ctx context.Context, l *pgtransport.Lease) error {
	if err := checkLease(l); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	err := c.held(ctx, "release", c.q.release, l.Group, l.Token)
	c.parking.Wake(wakesSettle(err))
	return err
}

// Extend moves the lease's end to now + visibility.
func (c *Core) Extend(ctx context.Context, l *pgtransport.Lease, visibility time.Duration) error {
	if err := cmp.Or(checkLease(l), checkVisibility(visibility)); err != nil {
		return fmt.Errorf("extend: %w", err)
	}
	err := c.fenced(ctx, "extend", c.q.extend, l.Group, l.Token, visibility.Seconds())
	c.lostIf("extend", l, err)
	return err
}

// ExtendMany moves the end of every lease in leases to now + visibility in
// one round-trip (a runtime's heartbeat): per lease, nil, or ErrLeaseLost
// where its token no longer holds its group (nothing changed for it; a
// second lease on a group already named is lost too). The error is for the
// call as a whole (bad input, the database). Unlike the other calls it
// neither logs nor observes the lost leases: its caller knows whether a
// lost answer is news (a heartbeat that raced the ack of a handler which
// just returned is not), and reports those that are.
func (c *Core) ExtendMany(ctx context.Context, leases []*pgtransport.Lease, visibility time.Duration) ([]error, error) {
	if err := cmp.Or(checkBatch(len(leases)), checkVisibility(visibility)); err != nil {
		return nil, fmt.Errorf("extend: %w", err)
	}
	groups := make([]string, len(leases))
	seqs := make([]int64, len(leases))
	tokens := make([]string, len(leases))
	for i, l := range leases {
		if err := checkLease(l); err != nil {
			return nil, fmt.Errorf("extend: lease %d: %w", i, err)
		}
		groups[i], seqs[i], tokens[i] = l.Group, l.Seq, l.Token
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("extend: %w", err)
	}
	rows, err := c.db.Query(ctx, c.q.extendMany, c.now(), groups, seqs, tokens, visibility.Seconds())
	if err != nil {
		return nil, mapErr("extend", err)
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[bool])
	if err != nil {
		return nil, mapErr("extend", err)
	}
	if len(held) != len(leases) {
		return nil, fmt.Errorf("extend: %d answers for %d leases", len(held), len(leases))
	}
	errs := make([]error, len(leases))
	for i, h := range held {
		if !h {
			errs[i] = fmt.Errorf("extend: %w", pgtransport.ErrLeaseLost)
		}
	}
	return errs, nil
}

// Wait records waiter (unless "") as idle, wanting a notification for any
// new group at or above minPriority, for ttl, and returns how long from now until the
// earliest lease or park among such groups runs out (ok false: none does).
func (c *Core) Wait(ctx context.Context, waiter string, minPriority int, ttl time.Duration) (next time.Duration, ok bool, err error) {
	var (
		now    float64
		expiry *float64
		who    *string
	)
	if waiter != "" {
		who = &waiter
	}
	if err := c.db.QueryRow(ctx, c.q.wait, c.now(), who, minPriority, ttl.Seconds()).Scan(&now, &expiry); err != nil {
		return 0, false, mapErr("wait", err)
	}
	if expiry == nil {
		return 0, false, nil
	}
	return time.Duration((*expiry - now) * float64(time.Second)), true, nil
}

// Unwait withdraws waiter's wish to be notified.
func (c *Core) Unwait(ctx context.Context, waiter string) error {
	if _, err := c.db.Exec(ctx, c.q.unwait, waiter); err != nil {
		return mapErr("unwait", err)
	}
	return nil
}

// Channel returns the NOTIFY channel of the schema's queue.
func (c *Core) Channel(ctx context.Context) (string, error) {
	var ch string
	if err := c.db.QueryRow(ctx, c.q.channel).Scan(&ch); err != nil {
		return "", mapErr("channel", err)
	}
	return ch, nil
}

// NewToken returns a fresh lease token for workerID.
func NewToken(workerID string) string { return workerID + ":" + newUUID() }

// fenced runs a statement that takes now ($1) and args and answers whether
// the token still held its group: false is ErrLeaseLost.
func (c *Core) fenced(ctx context.Context, op, sql string, args ...any) error {
	return c.held(ctx, op, sql, append([]any{c.now()}, args...)...)
}

// held runs a statement that answers whether the token still held its
// group: false is ErrLeaseLost.
func (c *Core) held(ctx context.Context, op, sql string, args ...any) error {
	return c.heldOn(ctx, c.db, op, sql, args...)
}

// heldOn is held through db (a caller's transaction, say).
func (c *Core) heldOn(ctx context.Context, db DBTX, op, sql string, args ...any) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	var held bool
	if err := db.QueryRow(ctx, sql, args...).Scan(&held); err != nil {
		return mapErr(op, err)
	}
	if !held {
		return fmt.Errorf("%s: %w", op, pgtransport.ErrLeaseLost)
	}
	return nil
}

// mapErr maps PostgreSQL error codes to the package's sentinels, keeping the
// original error in the chain.
func mapErr(op string, err error) error {
	if errors.Is(err, puddle.ErrClosedPool) {
		// The pool under the transport was closed (by the transport's
		// Close, or by its owner): the call never reached the server.
		return fmt.Errorf("%s: %w: %w", op, pgtransport.ErrClosed, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42883", "42P01", "3F000": // undefined_function, undefined_table, invalid_schema_name
			return fmt.Errorf("%s: %w: %w", op, pgtransport.ErrSchemaMissing, err)
		case "23514": // check_violation: the group-id rule (009_hardening.sql) or the priority CHECK
			if pgErr.ConstraintName == groupIDConstraint {
				return fmt.Errorf("%s: %w: %w", op, pgtransport.ErrInvalidGroup, err)
			}
			return fmt.Errorf("%s: %w: %w", op, pgtransport.ErrInvalidPriority, err)
		}
		if sentinel := refusals[pgErr.Code]; sentinel != nil {
			return fmt.Errorf("%s: %w: %w", op, sentinel, err)
		}
	}
	if pgErr == nil && mayHaveApplied(err) { // see outcome.go
		return fmt.Errorf("%s: %w: %w", op, pgtransport.ErrOutcomeUnknown, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// groupIDConstraint is the CHECK that holds every message's group id to
// the rule checkGroup applies (schema/sql/009_hardening.sql).
const groupIDConstraint = "transport_messages_group_id_valid"

// refusals maps the functions' own SQLSTATEs (class PT, see "Entry
// checks" in schema/sql/functions/15_checks.sql) to sentinels. The Go calls check
// their arguments first, so most of these reach a Go caller only through
// a hand-made Lease or a caller's own settings. PT009 has none: it is a
// proxy's refusal of a statement on the design's tables there
// (schema/sql/proxy.sql), which no Go call sends.
var refusals = map[string]error{
	"PT001": pgtransport.ErrLeaseLost,         // an ack of a seq the lease was not handed (its error says why)
	"PT002": pgtransport.ErrInvalidWorkerID,   // a NULL or empty lease token (workerID:uuid in Go)
	"PT003": pgtransport.ErrInvalidVisibility, // a lease or park end that is NULL or not after now
	"PT004": pgtransport.ErrInvalidDelay,      // a NULL or negative nack delay
	"PT005": pgtransport.ErrClockSkew,         // now too far from the server's clock
	"PT006": pgtransport.ErrInvalidDedupKey,   // a dedup key that is empty or longer than MaxDedupKeyBytes
	"PT007": pgtransport.ErrUnknownGroup,      // an operator's call on a group with no row (harel_group, harel_pause_group, ...)
	"PT008": pgtransport.ErrStateTooLarge,     // harel_ack_state of a state over pgtransport.MaxStateSize
	"PT010": pgtransport.ErrGroupMoved,        // a publish of a group that left this partition (a grown cluster)
	"PT011": pgtransport.ErrInvalidTenant,     // a tenant that is empty or longer than MaxTenantBytes
	"PT012": pgtransport.ErrInvalidWeight,     // a tenant weight outside 1 to MaxTenantWeight
}

// isNil reports whether db is nil, or an interface holding a nil pointer
// (a nil *pgxpool.Pool), which would otherwise panic on first use.
func isNil(db any) bool {
	if db == nil {
		return true
	}
	v := reflect.ValueOf(db)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Parking returns the queue where this core's idle callers wait: an async
// stream parks its ticket there and, for its own round-trips, wakes as many
// as Freed counts.
func (c *Core) Parking() *Parking { return &c.parking }

// DB is the database handle c runs on.
func (c *Core) DB() DBTX { return c.db }

// checkApplied refuses (ErrSchemaMissing) a schema that holds no queue (nor
// a proxy's functions), or one older than this library's (schema.Version),
// naming the fix: what a
// transport opened with SkipApply finds on open rather than at its first
// call. A server that cannot be reached gives no answer, and the
// transport opens (as it always could with SkipApply).
func checkApplied(ctx context.Context, db DBTX, name string) error {
	table, proxy := pgx.Identifier{"transport_schema_version"}, pgx.Identifier{"transport_proxy"}
	where := "the connection's current schema"
	if name != "" {
		table, proxy = pgx.Identifier{name, "transport_schema_version"}, pgx.Identifier{name, "transport_proxy"}
		where = fmt.Sprintf("schema %q", name)
	}
	var exists, isProxy bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`, table.Sanitize(), proxy.Sanitize()).Scan(&exists, &isProxy); err != nil {
		if _, answered := errors.AsType[*pgconn.PgError](err); answered {
			return mapErr("check the schema", err)
		}
		return nil
	}
	if isProxy {
		return nil // a PL/Proxy proxy's schema (schema.ApplyProxy): it checks its partitions' version itself
	}
	if !exists {
		return fmt.Errorf("open: %w: no queue in %s: apply the schema first, as its owner (pgtransport migrate apply, or schema.Apply), or open without Config.SkipApply",
			pgtransport.ErrSchemaMissing, where)
	}
	v, err := schema.CurrentVersion(ctx, db, name)
	if err != nil {
		return mapErr("check the schema", err)
	}
	if v < schema.Version() {
		return fmt.Errorf("open: %w: the queue in %s is at schema version %d, this library needs %d: upgrade it first, as its owner (pgtransport migrate apply, or schema.Apply)",
			pgtransport.ErrSchemaMissing, where, v, schema.Version())
	}
	return nil
}

// withHint adds hint to err when it is the server's error of SQLSTATE
// code: what to do about it.
func withHint(err error, code, hint string) error {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == code {
		return fmt.Errorf("%w (%s)", err, hint)
	}
	return err
}
