package sync

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
)

// DBTX is the connection a Transport runs on: a *pgxpool.Pool (safe for
// concurrent use), a *pgx.Conn (one goroutine at a time) or a pgx.Tx.
type DBTX = core.DBTX

// Transport is the blocking transport. It is safe for concurrent use when its
// DBTX is (a pool is).
type Transport struct {
	core   *core.Core    // also parks ClaimWait callers and wakes them
	owned  *pgxpool.Pool // closed by Close; set by FromDSN only
	closed atomic.Bool   // set by Close: every later call returns ErrClosed
}

// New returns a Transport on db. Unless cfg.SkipApply, it first brings the
// schema up to date (idempotent; safe from many workers at once).
func New(ctx context.Context, db DBTX, cfg pgtransport.Config) (*Transport, error) {
	c, err := core.New(ctx, db, cfg)
	if err != nil {
		return nil, err
	}
	return &Transport{core: c}, nil
}

// FromDSN connects to dsn with a pool and returns a Transport that owns it.
// An empty dsn means libpq's defaults (the PG* environment variables, the
// local socket, the OS user's name as role and database), as pgx reads
// them.
// While the server does not accept connections it retries with exponential
// backoff, so a worker started beside PostgreSQL waits for it; it gives up
// when ctx ends or cfg.MaxConnectWait passes, with an error that wraps both
// the reason it stopped and the last connection error. A malformed dsn fails
// at once. The pool holds up to pgtransport.DefaultPoolSize (20)
// connections unless the dsn sets pool_max_conns: each call in flight
// holds one, so a Work with Concurrency above 16, or as many ClaimWait
// loops, wants pool_max_conns=Concurrency+4 (or a pool of your own, with
// New).
func FromDSN(ctx context.Context, dsn string, cfg pgtransport.Config) (*Transport, error) {
	t, pool, err := core.FromDSN(ctx, dsn, cfg, func(pool *pgxpool.Pool, cfg pgtransport.Config) (*Transport, error) {
		return New(ctx, pool, cfg)
	})
	if err != nil {
		return nil, err
	}
	t.owned = pool
	return t, nil
}

// Close closes the Transport: a ClaimWait waiting for work returns
// ErrClosed at once, and every later call returns ErrClosed (errors.Is),
// however the Transport was made. A Transport from FromDSN also closes its
// pool, once the round-trips in flight have finished (a call that had not
// reached the pool yet returns ErrClosed too); a lease a ClaimWait claims
// at that very instant cannot be given back on the closed pool and comes
// back after its visibility. A Transport made with New leaves its
// connection open: the caller owns it (and a lease claimed at that instant
// is given back on it). Safe to call twice.
func (t *Transport) Close() {
	t.closed.Store(true)
	t.core.Parking().Close() // waits end now, not at their next look
	if t.owned != nil {
		t.owned.Close()
	}
}

// check is ErrClosed, for op, once Close has been called; else nil.
func (t *Transport) check(op string) error {
	if t.closed.Load() {
		return fmt.Errorf("%s: %w", op, pgtransport.ErrClosed)
	}
	return nil
}

// Publish appends event to group's FIFO and returns its seq. A new group gets
// priority (0-4); an existing one keeps its priority and any live lease. One
// round-trip.
//
// A lost reply (ErrOutcomeUnknown): the message may have been appended;
// publishing it again may add a second copy.
func (t *Transport) Publish(ctx context.Context, group, event string, priority int) (int64, error) {
	if err := t.check("publish"); err != nil {
		return 0, err
	}
	return t.core.Publish(ctx, group, event, priority)
}

// PublishMany appends every message, in slice order (so in order within
// each group), and returns their seqs in that order. A message that
// creates its group gives it its priority. Up to pgtransport.MaxBatch
// messages are one round-trip; a longer batch is sent in chunks of
// MaxBatch inside one transaction, so it too applies whole or not at all
// (its messages are claimable once it commits), and need not be cut up
// by the caller. An empty batch is ErrInvalidBatch; one bad message
// refuses the whole batch with a typed error naming it, and nothing is
// written. A message with a
// DedupKey is deduplicated as by PublishMessage, against earlier
// publishes and earlier messages of the batch: a repeat stores nothing
// and returns the first one's seq.
//
// A lost reply (ErrOutcomeUnknown): the whole batch was appended, or none
// of it; publishing it again may add a second copy of each message
// without a DedupKey (those with one are not stored twice within the
// window).
func (t *Transport) PublishMany(ctx context.Context, msgs []pgtransport.Message) ([]int64, error) {
	if err := t.check("publish"); err != nil {
		return nil, err
	}
	return t.core.PublishMany(ctx, msgs)
}

// PublishTx is Publish inside the caller's transaction: the message commits
// or rolls back with the caller's own writes, and is invisible to claims
// until then.
func (t *Transport) PublishTx(ctx context.Context, tx pgx.Tx, group, event string, priority int) (int64, error) {
	if err := t.check("publish"); err != nil {
		return 0, err
	}
	return t.core.PublishTx(ctx, tx, group, event, priority)
}

// PublishMessage appends msg to its group's FIFO and returns its seq, as
// Publish. With a msg.DedupKey it is idempotent: if the same (group, key)
// was published within Config.DedupWindow, it writes nothing and returns
// the seq of that first message (even if that one was since acked), and
// concurrent publishes of one key store exactly one message. A bad key is
// ErrInvalidDedupKey, and nothing is written. One round-trip.
//
// A lost reply (ErrOutcomeUnknown): with a DedupKey, publish it again
// within the window: it returns the seq of the one stored, or stores it
// now. Without one, as Publish.
func (t *Transport) PublishMessage(ctx context.Context, msg pgtransport.Message) (int64, error) {
	if err := t.check("publish"); err != nil {
		return 0, err
	}
	return t.core.PublishMessage(ctx, msg)
}

// PublishMessageTx is PublishMessage inside the caller's transaction: the
// message and its dedup key commit or roll back with the caller's own
// writes. A concurrent publish of the same key waits for that transaction
// and, if it rolls back, stores its own message.
func (t *Transport) PublishMessageTx(ctx context.Context, tx pgx.Tx, msg pgtransport.Message) (int64, error) {
	if err := t.check("publish"); err != nil {
		return 0, err
	}
	return t.core.PublishMessageTx(ctx, tx, msg)
}

// Claim leases the claimable group (priority >= minPriority) that was served
// longest ago and returns its head, held for visibility (at least
// pgtransport.MinVisibility, as for every method that takes one). It
// returns nil, nil when nothing is claimable; it does not wait for work
// (ClaimWait does). One round-trip.
//
// A lost reply (ErrOutcomeUnknown): a group may have been leased to a token
// nobody holds; it comes back after visibility.
func (t *Transport) Claim(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	if err := t.check("claim"); err != nil {
		return nil, err
	}
	return t.core.Claim(ctx, workerID, visibility, minPriority)
}

// Ack deletes the lease's message and frees its group for the next claim (or
// deletes the group's row when it has no message left). ErrLeaseLost if the
// lease no longer holds. One round-trip.
//
// A lost reply (ErrOutcomeUnknown, wrapping the connection's or ctx's
// error): the message was deleted, or nothing changed and the lease holds
// as before (its message comes back after the lease's end unless settled).
// Acking again tells which while the lease holds: nil if the first ack had
// not applied (this one did); ErrLeaseLost if it had, or if the lease
// lapsed meanwhile and another worker took the group.
func (t *Transport) Ack(ctx context.Context, lease *pgtransport.Lease) error {
	if err := t.check("ack"); err != nil {
		return err
	}
	return t.core.Ack(ctx, lease)
}

// ClaimWait is Claim that waits for work instead of returning nil: it
// blocks until it holds a lease, or returns ctx's error. Idle callers park
// rather than spin: an ack, nack or publish through this Transport wakes
// one of them; otherwise they look again when the earliest lease or park
// among claimable groups runs out, and at most every Config.IdleSweep (new
// work from other processes is found then; async streams wake on
// notifications instead).
//
// A lost reply (ErrOutcomeUnknown): as Claim.
func (t *Transport) ClaimWait(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	if err := t.check("claim"); err != nil {
		return nil, err
	}
	return t.core.ClaimWait(ctx, workerID, visibility, minPriority)
}

// ClaimMany leases up to max claimable groups (1 to pgtransport.MaxBatch)
// in one round-trip and returns the head of each, served longest ago
// first; empty when nothing is claimable. The leases share one token; each
// is fenced on its own group.
//
// A lost reply (ErrOutcomeUnknown): up to max groups may have been leased
// to a token nobody holds; they come back after visibility.
func (t *Transport) ClaimMany(ctx context.Context, workerID string, visibility time.Duration, minPriority, max int) ([]*pgtransport.Lease, error) {
	if err := t.check("claim"); err != nil {
		return nil, err
	}
	return t.core.ClaimMany(ctx, workerID, visibility, minPriority, max)
}

// AckMany settles leases in one round-trip, each fenced on its own token.
// The result has an entry per lease: nil, or ErrLeaseLost where that lease
// no longer held (nothing changed for it). The error is for the call.
//
// A lost reply (ErrOutcomeUnknown, and ctx's error too when ctx ended while
// it ran, as with a deadline that fires after the commit): no per-lease
// result; the round-trip applied whole or not at all, so either every
// lease that held was acked (its message deleted) or nothing changed and
// each holds as before. AckMany again tells which for each lease while the
// leases hold, as Ack does.
func (t *Transport) AckMany(ctx context.Context, leases []*pgtransport.Lease) ([]error, error) {
	if err := t.check("ack"); err != nil {
		return nil, err
	}
	return t.core.AckMany(ctx, leases)
}

// AckNext acks the lease and, when its group has another message and the
// lease has taken fewer than Config.MaxKeep in a row, keeps the group: it
// returns that next message under the same lease, held for visibility,
// with no claim in between. Otherwise it returns nil and the group is
// freed for the round-robin. ErrLeaseLost if the lease no longer held. One
// round-trip: a hot group is served at one round-trip per message.
//
// The lease it returns is held, as a claim's is, until it is settled (Ack,
// AckNext, Nack, Fail) or its visibility runs out: a worker that stops
// with it in hand (shutting down, or giving up on an error of its own)
// holds up its whole group until then, unless it gives it back with
// Nack(ctx, next, 0), which frees the group at once (that hand-out still
// counts as an attempt). Work does this for you.
//
// A lost reply (ErrOutcomeUnknown): as Ack, except that an ack that kept the
// group is safe to repeat: AckNext again with the same lease returns the
// same next message, under the same lease, as long as it holds.
func (t *Transport) AckNext(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) (*pgtransport.Lease, error) {
	if err := t.check("ack"); err != nil {
		return nil, err
	}
	return t.core.AckNext(ctx, lease, visibility)
}

// Nack gives the lease back without deleting the message. delay > 0 parks the
// group until now+delay (the message stays its head; the token still holds
// it); delay == 0 frees it at once, first in line. ErrLeaseLost if the lease
// no longer holds. One round-trip.
//
// A lost reply (ErrOutcomeUnknown): the group was given back (parked or
// freed), or nothing changed and the lease holds as before; Nack again
// tells which while it holds (nil: this one gave it back).
func (t *Transport) Nack(ctx context.Context, lease *pgtransport.Lease, delay time.Duration) error {
	if err := t.check("nack"); err != nil {
		return err
	}
	return t.core.Nack(ctx, lease, delay)
}

// Fail ends the lease as a failed attempt: it records cause's text on the
// message (nil: none; made valid UTF-8, without NUL bytes, and cut to
// pgtransport.MaxErrorBytes) and, by the queue's policy (Config.MaxAttempts,
// RetryBackoffMin/Max, OnExhausted): while the message has attempts left
// (Lease.Attempt below MaxAttempts), parks the group for a backoff that
// doubles with each attempt, with jitter, within the policy's bounds (the
// message stays its head, and is handed out again, to any worker, when
// the backoff ends); otherwise it moves the message to the dead letters
// and frees the group for its next message, or (StopGroup) stops the
// group with the message still its head until RestartGroup. Either way
// the lease is over: unlike Nack with a delay, which parks under the
// lease, a later Ack, Nack or Extend of it returns ErrLeaseLost. Fenced
// like Ack: ErrLeaseLost if the lease no longer holds, and nothing
// changed. One round-trip.
//
// A lost reply (ErrOutcomeUnknown): it applied whole, or nothing changed
// and the lease holds until it lapses; either way the message is handed
// out again later (as its next attempt), unless this Fail dead-lettered
// it or stopped its group.
func (t *Transport) Fail(ctx context.Context, lease *pgtransport.Lease, cause error) error {
	if err := t.check("fail"); err != nil {
		return err
	}
	_, err := t.core.Fail(ctx, lease, cause)
	return err
}

// Extend makes the lease hold until now+visibility, for handlers that run
// long. ErrLeaseLost if the lease no longer holds. One round-trip.
//
// A lost reply (ErrOutcomeUnknown): the lease holds until now+visibility,
// or nothing changed; Extend again (nil: it holds until then).
func (t *Transport) Extend(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) error {
	if err := t.check("extend"); err != nil {
		return err
	}
	return t.core.Extend(ctx, lease, visibility)
}

// DeadLetters returns a page of the queue's dead letters, in seq order:
// those of q.Group ("" every group) with a seq after q.After, at most
// q.Limit (0: pgtransport.DefaultDeadLetterLimit; at most
// pgtransport.MaxBatch). Page on with After set to the last Seq returned.
// A read. One round-trip.
func (t *Transport) DeadLetters(ctx context.Context, q pgtransport.DeadLetterQuery) ([]pgtransport.DeadLetter, error) {
	if err := t.check("dead letters"); err != nil {
		return nil, err
	}
	return t.core.DeadLetters(ctx, q)
}

// Redrive puts the dead letters f selects back into their groups and
// returns how many: each at the head of its group with its own seq, so in
// their original order and ahead of the messages published after them; a
// group that drained meanwhile is created again. Each is then a fresh
// message (Lease.Attempt starts at 1 again). Safe against concurrent
// publishers and consumers. One round-trip, one transaction.
//
// A lost reply (ErrOutcomeUnknown): all were put back, or none; Redrive
// again puts back those still dead.
func (t *Transport) Redrive(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error) {
	if err := t.check("redrive"); err != nil {
		return 0, err
	}
	return t.core.Redrive(ctx, f)
}

// PurgeDeadLetters deletes the dead letters f selects for good and returns
// how many. One round-trip, one transaction.
//
// A lost reply (ErrOutcomeUnknown): all were deleted, or none; purging
// again deletes those left.
func (t *Transport) PurgeDeadLetters(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error) {
	if err := t.check("purge dead letters"); err != nil {
		return 0, err
	}
	return t.core.PurgeDeadLetters(ctx, f)
}

// RestartGroup resumes a group the queue stopped (policy
// pgtransport.StopGroup): it goes back into the round-robin and its head
// gets fresh attempts; with skipHead the head is first moved to the dead
// letters, and the group goes on with its next message.
// ErrGroupNotStopped if the group is not stopped, and nothing changed. One
// round-trip.
//
// A lost reply (ErrOutcomeUnknown): it was restarted, or nothing changed;
// RestartGroup again tells which (ErrGroupNotStopped: the first one did,
// unless the group stopped again since).
func (t *Transport) RestartGroup(ctx context.Context, group string, skipHead bool) error {
	if err := t.check("restart group"); err != nil {
		return err
	}
	return t.core.RestartGroup(ctx, group, skipHead)
}
