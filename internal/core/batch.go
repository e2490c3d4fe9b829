package core

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtransport/pgtransport"
)

// PublishMany appends every message, in slice order (so in order within
// each group), and returns their seqs in the same order. A message that
// creates its group gives it its priority. A message with a DedupKey whose
// (group, key) was published within Config.DedupWindow, or earlier in the
// batch, is not stored: its seq is the first one's. Up to MaxBatch
// messages go in one round-trip; a longer batch goes in chunks of
// MaxBatch inside one transaction (see publishChunks). It wakes a parked
// caller per message.
func (c *Core) PublishMany(ctx context.Context, msgs []pgtransport.Message) ([]int64, error) {
	return c.publishObserved(ctx, msgs, false)
}

// PublishHere is PublishMany on a partition of a growing cluster (a
// Cluster's first try of a moving group, in its old home): the messages
// of a group whose home is another partition and that has nothing left
// here are not published, and their seqs are 0, for the caller to publish
// in the group's new home; the others are published as PublishMany does.
func (c *Core) PublishHere(ctx context.Context, msgs []pgtransport.Message) ([]int64, error) {
	return c.publishObserved(ctx, msgs, true)
}

func (c *Core) publishObserved(ctx context.Context, msgs []pgtransport.Message, here bool) ([]int64, error) {
	t0 := c.timer()
	seqs, err := c.publishMany(ctx, msgs, here)
	n := len(msgs)
	if err == nil {
		n -= count(seqs, 0) // handed back: published elsewhere, observed there
	}
	c.observePublished(t0, n, err)
	c.parking.Wake(wakesPublish(n, err))
	return seqs, err
}

// count is how many of xs are x.
func count[T comparable](xs []T, x T) int {
	n := 0
	for _, v := range xs {
		if v == x {
			n++
		}
	}
	return n
}

func (c *Core) publishMany(ctx context.Context, msgs []pgtransport.Message, here bool) ([]int64, error) {
	if len(msgs) == 0 {
		return nil, fmt.Errorf("publish: %w: no messages", pgtransport.ErrInvalidBatch)
	}
	for i, m := range msgs {
		if err := c.checkMessage(m); err != nil {
			return nil, fmt.Errorf("publish: message %d: %w", i, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	if len(msgs) <= pgtransport.MaxBatch {
		return c.publishChunk(ctx, c.db, msgs, here)
	}
	return c.publishChunks(ctx, msgs, here)
}

// publishChunks publishes a batch longer than MaxBatch in chunks of
// MaxBatch, in order, inside one transaction (a savepoint inside a
// caller's): the batch applies whole or not at all, as a short one does,
// so a caller never has to find out which prefix of its batch made it.
// Dedup keys are honoured across chunks (a chunk sees the keys the
// earlier ones stored). The cost of the one transaction: its messages are
// invisible to claims until it commits, and, with DedupKeys, it holds
// their keys until then, so two such batches naming the same keys in
// opposite orders can deadlock (PostgreSQL then fails one, which applied
// nothing).
func (c *Core) publishChunks(ctx context.Context, msgs []pgtransport.Message, here bool) ([]int64, error) {
	var (
		seqs     = make([]int64, 0, len(msgs))
		chunkErr error // a chunk's error, mapped already
	)
	err := pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
		for chunk := range slices.Chunk(msgs, pgtransport.MaxBatch) {
			s, err := c.publishChunk(ctx, tx, chunk, here)
			if err != nil {
				chunkErr = err
				return err
			}
			seqs = append(seqs, s...)
		}
		return nil
	})
	switch {
	case chunkErr != nil:
		return nil, chunkErr
	case err != nil:
		return nil, mapErr("publish", err) // the begin or the commit
	}
	return seqs, nil
}

// publishChunk appends msgs, checked, at most MaxBatch, in one statement
// through db: the core's handle or a transaction; with here, as
// PublishHere says.
func (c *Core) publishChunk(ctx context.Context, db DBTX, msgs []pgtransport.Message, here bool) ([]int64, error) {
	groups := make([]string, len(msgs))
	events := make([]string, len(msgs))
	prios := make([]int32, len(msgs))
	keys := make([]*string, len(msgs)) // NULL: no key
	keyed := false
	var tenants []*string // NULL where no message names a tenant; a NULL element: the default
	for i, m := range msgs {
		groups[i], events[i], prios[i] = m.Group, m.Event, int32(m.Priority)
		if m.DedupKey != "" {
			keys[i], keyed = &msgs[i].DedupKey, true
		}
		if m.Tenant != "" {
			if tenants == nil {
				tenants = make([]*string, len(msgs))
			}
			tenants[i] = &msgs[i].Tenant
		}
	}
	if here {
		return c.publishChunkHere(ctx, db, groups, events, prios, keys, keyed, tenants)
	}
	var (
		rows pgx.Rows
		err  error
	)
	if keyed { // the keyed publish only when it is needed: the plain one is cheaper
		rows, err = db.Query(ctx, c.q.publishKeyed, groups, events, prios, keys, c.cfg.DedupWindow.Seconds(), tenants)
	} else {
		rows, err = db.Query(ctx, c.q.publishMany, groups, events, prios, tenants)
	}
	if err != nil {
		return nil, mapErr("publish", err)
	}
	seqs := make([]int64, 0, len(msgs))
	for rows.Next() {
		var s int64
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return nil, mapErr("publish", err)
		}
		seqs = append(seqs, s)
	}
	if err := rows.Err(); err != nil {
		return nil, mapErr("publish", err)
	}
	return seqs, nil
}

// publishChunkHere is publishChunk's statement for PublishHere: each seq
// comes back beside its input's place, NULL (0 here) where handed back.
func (c *Core) publishChunkHere(ctx context.Context, db DBTX, groups, events []string, prios []int32, keys []*string, keyed bool,
	tenants []*string) ([]int64, error) {
	ords := make([]int32, len(groups))
	for i := range ords {
		ords[i] = int32(i + 1)
	}
	var window *float64 // NULL: the plain publish
	if keyed {
		w := c.cfg.DedupWindow.Seconds()
		window = &w
	}
	rows, err := db.Query(ctx, c.q.publishHere, ords, groups, events, prios, keys, window, tenants)
	if err != nil {
		return nil, mapErr("publish", err)
	}
	seqs := make([]int64, len(groups))
	var (
		ord int32
		seq *int64
	)
	_, err = pgx.ForEachRow(rows, []any{&ord, &seq}, func() error {
		if ord < 1 || int(ord) > len(seqs) {
			return fmt.Errorf("a row for input %d of %d", ord, len(seqs))
		}
		if seq != nil {
			seqs[ord-1] = *seq
		}
		return nil
	})
	if err != nil {
		return nil, mapErr("publish", err)
	}
	return seqs, nil
}

// ClaimMany leases up to max claimable groups (priority >= minPriority,
// served longest ago first) and returns the head of each, held for
// visibility, all under one token. Empty when nothing is claimable.
func (c *Core) ClaimMany(ctx context.Context, workerID string, visibility time.Duration, minPriority, max int) ([]*pgtransport.Lease, error) {
	if err := checkBatch(max); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	_, claimed, err := c.Exchange(ctx, nil, false, workerID, visibility, minPriority, max)
	return claimed, err
}

// Settled is what an ack in a batch came to.
type Settled struct {
	Lease *pgtransport.Lease
	Err   error              // nil, or ErrLeaseLost (the lease no longer held: nothing changed for it)
	Next  *pgtransport.Lease // the group's next head under the same lease, if it was kept
}

// settleOnlyVisibility is the visibility AckMany hands to Exchange. Such
// an exchange keeps no group and claims none, so no lease is given this
// length and the value is never written: it only has to pass the
// visibility check, which the shortest allowed does.
const settleOnlyVisibility = pgtransport.MinVisibility

// AckMany acks leases in one round-trip, each fenced on its own token, and
// frees every group it acked in (none is kept). The result has an entry
// per lease, in order: nil, or ErrLeaseLost where that lease no longer
// held (nothing changed for it). The error is for the call. It wakes a
// parked caller per group freed.
func (c *Core) AckMany(ctx context.Context, leases []*pgtransport.Lease) ([]error, error) {
	settled, err := c.settle(ctx, leases, false, settleOnlyVisibility)
	if err != nil {
		return nil, err
	}
	c.parking.Wake(Freed(settled))
	errs := make([]error, len(settled))
	for i, s := range settled {
		errs[i] = s.Err
	}
	return errs, nil
}

// settle acks leases in one round-trip, each fenced on its own token. With
// keep, a lease whose group has another message and that has taken fewer
// than Config.MaxKeep in a row is kept (for visibility) and its next head
// returned in Next. It wakes nobody: its callers do.
func (c *Core) settle(ctx context.Context, leases []*pgtransport.Lease, keep bool, visibility time.Duration) ([]Settled, error) {
	if err := checkBatch(len(leases)); err != nil {
		return nil, fmt.Errorf("ack: %w", err)
	}
	settled, _, err := c.Exchange(ctx, leases, keep, "", visibility, 0, 0)
	return settled, err
}

// Exchange is a worker's round-trip: settle acks (as AckMany, or with keep
// as AckNext) and lease up to limit groups, fewer those kept (as ClaimMany,
// for workerID), in one transaction. It wakes nobody: its caller, a
// stream, wakes Freed(settled) others, passing over its own ticket.
func (c *Core) Exchange(ctx context.Context, acks []*pgtransport.Lease, keep bool, workerID string, visibility time.Duration, minPriority, limit int) ([]Settled, []*pgtransport.Lease, error) {
	t0 := c.timer()
	settled, claimed, err := c.exchange(ctx, acks, keep, workerID, visibility, minPriority, limit, false)
	c.observeExchange(t0, len(acks), limit, settled, claimed, err)
	c.reportLost(settled)
	return settled, claimed, err
}

// StreamExchange is Exchange for an async stream. It leaves the acks it
// finds lost unreported (LeaseLost: the log and the observer), since the
// stream may yet find such an ack applied (retrying an ack whose reply was
// lost) and reports those it calls lost in the end itself. And its claim
// may rest: for up to 2 s after a costly walk from the first slot leased
// nothing, it may return no lease though a group behind the sweep's cursor
// is claimable ("Going round" in schema/sql/functions/30_claim.sql), which a
// stream, waiting for a wake-up or its IdleSweep, asks again for.
func (c *Core) StreamExchange(ctx context.Context, acks []*pgtransport.Lease, keep bool, workerID string, visibility time.Duration, minPriority, limit int) ([]Settled, []*pgtransport.Lease, error) {
	t0 := c.timer()
	settled, claimed, err := c.exchange(ctx, acks, keep, workerID, visibility, minPriority, limit, true)
	c.observeExchange(t0, len(acks), limit, settled, claimed, err)
	return settled, claimed, err
}

func (c *Core) exchange(ctx context.Context, acks []*pgtransport.Lease, keep bool, workerID string, visibility time.Duration, minPriority, limit int, rest bool) ([]Settled, []*pgtransport.Lease, error) {
	if limit > 0 || workerID != "" {
		if err := CheckClaim(workerID, visibility, minPriority); err != nil {
			return nil, nil, fmt.Errorf("exchange: %w", err)
		}
	} else if err := checkVisibility(visibility); err != nil {
		return nil, nil, fmt.Errorf("exchange: %w", err)
	}
	if limit < 0 || limit > pgtransport.MaxBatch || len(acks) > pgtransport.MaxBatch {
		return nil, nil, fmt.Errorf("exchange: %w: %d acks, limit %d, the bound is %d", pgtransport.ErrInvalidBatch, len(acks), limit, pgtransport.MaxBatch)
	}
	n := len(acks)
	groups, seqs, tokens, keeps := make([]string, n), make([]int64, n), make([]string, n), make([]*bool, n)
	for i, l := range acks {
		if err := checkLease(l); err != nil {
			return nil, nil, fmt.Errorf("exchange: lease %d: %w", i, err)
		}
		groups[i], seqs[i], tokens[i] = l.Group, l.Seq, l.Token
		keeps[i] = new(bool) // false: free the group
		if keep {
			keeps[i] = c.keepFor(l)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("exchange: %w", err)
	}
	token := ""
	if limit > 0 {
		token = NewToken(workerID)
	}
	db, done, err := c.conn(ctx)
	if err != nil {
		return nil, nil, mapErr("exchange", err)
	}
	defer done()
	sent := time.Now()
	rows, err := db.Query(ctx, c.q.exchange, c.now(), visibility.Seconds(), token, minPriority, limit, groups, seqs, tokens, keeps, rest)
	if err != nil {
		return nil, nil, mapErr("exchange", err)
	}
	defer rows.Close()
	var (
		settled = make([]Settled, 0, n)
		claimed []*pgtransport.Lease
	)
	for rows.Next() {
		var (
			kind, group string
			held        bool
			seq         *int64
			event       *string
			attempt     *int
			age         *float64
		)
		if err := rows.Scan(&kind, &group, &held, &seq, &event, &attempt, &age); err != nil {
			return nil, nil, mapErr("exchange", err)
		}
		switch kind {
		case "a":
			i := len(settled)
			if i >= n {
				return nil, nil, fmt.Errorf("exchange: more results than acks")
			}
			s := Settled{Lease: acks[i]}
			switch {
			case !held:
				s.Err = pgtransport.ErrLeaseLost
			case seq != nil:
				l := *acks[i]
				l.Seq, l.Event, l.Expiry, l.Kept = *seq, *event, localExpiry(sent, visibility), acks[i].Kept+1
				l.Attempt, l.PublishedAt = deref(attempt), localPublished(sent, age)
				s.Next = &l
			}
			settled = append(settled, s)
		case "c":
			claimed = append(claimed, &pgtransport.Lease{Group: group, Seq: *seq, Event: *event, Token: token,
				Expiry: localExpiry(sent, visibility), Attempt: deref(attempt), PublishedAt: localPublished(sent, age)})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, mapErr("exchange", err)
	}
	if len(settled) != n {
		return nil, nil, fmt.Errorf("exchange: %d results for %d acks", len(settled), n)
	}
	return settled, claimed, nil
}

// deref is *p, or 0 for nil.
func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// ReleasesAny reports whether acking leases with keep frees some group for
// sure: a lease that may not be kept any longer.
func (c *Core) ReleasesAny(leases []*pgtransport.Lease) bool {
	for _, l := range leases {
		if !c.mayKeep(l) {
			return true
		}
	}
	return false
}

// mayKeep reports whether an ack may keep l's group for one more message.
func (c *Core) mayKeep(l *pgtransport.Lease) bool {
	return c.cfg.MaxKeep > 0 && l.Kept+1 < c.cfg.MaxKeep
}

// keepFor is what an ack that may keep asks the database to do with l's
// group (p_keep; "A keep yields" in schema/sql/functions/40_ack.sql):
// keep it for its next message (true) while l has taken fewer than
// Config.KeepWhileWaiting in a row, then keep it only while no other group
// waits to be claimed (NULL), and free it (false) once it may not keep.
func (c *Core) keepFor(l *pgtransport.Lease) *bool {
	if !c.mayKeep(l) {
		return new(bool)
	}
	if l.Kept+1 < c.cfg.KeepWhileWaiting {
		always := true
		return &always
	}
	return nil
}

func checkBatch(n int) error {
	if n == 0 || n > pgtransport.MaxBatch {
		return fmt.Errorf("%w: %d messages, want 1 to %d", pgtransport.ErrInvalidBatch, n, pgtransport.MaxBatch)
	}
	return nil
}

// ClaimWait is Claim that waits for work instead of returning nil. Between
// empty claims it parks in the core's Parking (woken as wake.go says),
// until the earliest lease or park among the claimable groups runs out, or
// for at most Config.IdleSweep. It returns ctx's error when ctx ends, and
// ErrClosed once the Parking is closed: a lease claimed by the round-trip
// in flight then is given back (Release: free at once, not counted as an
// attempt), as nobody will take it.
func (c *Core) ClaimWait(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	return c.claimWait(ctx, false, workerID, visibility, minPriority)
}

// ClaimWaitDetached is ClaimWait whose claims ctx does not cut short: each
// runs under a timeout of its own (detachedClaimTimeout), so a claim in
// flight when ctx ends completes, and its lease is given back (not counted
// as an attempt) rather than left in doubt; then it returns ctx's error.
// The runtime's slots wait with it: ctx is their shutdown.
func (c *Core) ClaimWaitDetached(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	return c.claimWait(ctx, true, workerID, visibility, minPriority)
}

// detachedClaimTimeout bounds a ClaimWaitDetached claim.
const detachedClaimTimeout = 30 * time.Second

func (c *Core) claimWait(ctx context.Context, detach bool, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	p := &c.parking
	for {
		if p.Closed() {
			return nil, fmt.Errorf("claim: %w", pgtransport.ErrClosed)
		}
		ticket := p.Ticket() // before the claim: a wake-up after it is not lost
		claimCtx, cancel := ctx, context.CancelFunc(func() {})
		if detach {
			claimCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), detachedClaimTimeout)
		}
		l, err := c.Claim(claimCtx, workerID, visibility, minPriority)
		cancel()
		if l != nil && p.Closed() {
			ticket.Done()
			c.giveBack(ctx, l)
			return nil, fmt.Errorf("claim: %w", pgtransport.ErrClosed)
		}
		if err != nil && p.Closed() {
			// Closed while the claim ran: the pool may be gone too, and
			// its error ("closed pool") is the Close the caller must see.
			ticket.Done()
			return nil, fmt.Errorf("claim: %w", pgtransport.ErrClosed)
		}
		if l != nil && detach && ctx.Err() != nil {
			ticket.Done()
			c.giveBack(ctx, l)
			return nil, fmt.Errorf("claim: %w", ctx.Err())
		}
		if l != nil || err != nil {
			ticket.Done()
			return l, err
		}
		d, ok, err := c.Wait(ctx, "", minPriority, 0)
		if err != nil {
			ticket.Done()
			if p.Closed() {
				return nil, fmt.Errorf("claim: %w", pgtransport.ErrClosed)
			}
			return nil, fmt.Errorf("claim: %w", err)
		}
		wait := c.cfg.IdleSweep
		if ok {
			wait = min(wait, d+time.Millisecond)
		}
		timer := time.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			timer.Stop()
			ticket.Done()
			return nil, fmt.Errorf("claim: %w", ctx.Err())
		case <-ticket.C():
		case <-timer.C:
			ticket.Done()
		}
		timer.Stop()
	}
}

// AckNext acks l and, if its group has another message and l may keep it
// (keepFor: fewer than Config.MaxKeep in a row, and fewer than
// Config.KeepWhileWaiting or no other group waiting), keeps the group
// under the same lease for visibility and returns that next message; else
// nil (the group is freed or, drained, deleted) and it wakes one parked
// caller. One round-trip.
func (c *Core) AckNext(ctx context.Context, l *pgtransport.Lease, visibility time.Duration) (*pgtransport.Lease, error) {
	if err := checkLease(l); err != nil {
		return nil, fmt.Errorf("ack: %w", err)
	}
	settled, err := c.settle(ctx, []*pgtransport.Lease{l}, true, visibility)
	if err != nil {
		return nil, err
	}
	c.parking.Wake(Freed(settled))
	if err := settled[0].Err; err != nil {
		return nil, fmt.Errorf("ack: %w", err)
	}
	return settled[0].Next, nil
}

// giveBack releases l (Release: free at once, first in line, the attempt
// not counted), even when ctx has ended (under a short timeout of its
// own): a lease nobody will work on is claimable again at once instead of
// after its visibility. A failure leaves it to lapse (and count).
func (c *Core) GiveBack(ctx context.Context, l *pgtransport.Lease) { c.giveBack(ctx, l) }

func (c *Core) giveBack(ctx context.Context, l *pgtransport.Lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	_ = c.Release(ctx, l)
}

// giveBackTimeout bounds a give-back during shutdown.
const giveBackTimeout = 5 * time.Second

// Here is those of groups that have anything in this database (a row,
// a message, a dead letter, a kept state, a dedup key in its window): a
// Cluster's locate of a moving group while the cluster grows. It decides
// nothing: the partition's fence does, and Left asks it.
func (c *Core) Here(ctx context.Context, groups []string) ([]string, error) {
	return c.groups(ctx, c.q.here, groups)
}

// Left is those of groups whose home is another partition and that have
// left this one, as its fence decides (under its locks, in a statement of
// its own): they never come back, so they may be published in their new
// home from then on.
func (c *Core) Left(ctx context.Context, groups []string) ([]string, error) {
	return c.groups(ctx, c.q.left, groups)
}

// groups runs sql, a query of $1's groups that returns some of them.
func (c *Core) groups(ctx context.Context, sql string, groups []string) ([]string, error) {
	rows, err := c.db.Query(ctx, sql, groups)
	if err != nil {
		return nil, mapErr("locate", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, mapErr("locate", err)
	}
	return out, nil
}
