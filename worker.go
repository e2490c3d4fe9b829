package pgtransport

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Defaults of a WorkerConfig's zero fields.
const (
	// DefaultConcurrency is WorkerConfig.Concurrency's value when it is 0.
	DefaultConcurrency = 16
	// DefaultWorkerVisibility is WorkerConfig.Visibility's value when it
	// is 0.
	DefaultWorkerVisibility = 30 * time.Second
	// DefaultShutdownTimeout is WorkerConfig.ShutdownTimeout's value when
	// it is 0.
	DefaultShutdownTimeout = 30 * time.Second
	// AbandonTimeout is how long a shutdown waits, after it cancelled the
	// handlers' ctx, for a handler that ignores it: then Work returns
	// without it (an error is logged), and its lease lapses.
	AbandonTimeout = 5 * time.Second
)

// Handler handles one message, the head of lease.Group, which no other
// worker is handed while it runs. Returning nil acks the message; an error
// fails it (Fail: the queue's retry policy, then the dead letters); a panic
// is recovered, logged with its stack, and fails it with the panic as the
// cause. Two errors say more: DeadLetterNow(err) moves the message to the
// dead letters at once, with err as its cause, whatever attempts it has
// left (a malformed event that can never succeed); Snooze(d) ends the
// attempt uncounted and parks the group for d (the message stays its
// head, handed out again after d). Handlers of different groups run concurrently; a group's messages
// are handled one at a time, in order.
//
// ctx is cancelled when the lease is lost (a heartbeat found another worker
// holds the group, or could not extend it before it lapsed) and at the end
// of a graceful shutdown's ShutdownTimeout. After a lost lease the message
// will be handled again elsewhere, and the handler's result is ignored: it
// neither acks nor fails. After a shutdown's cancel, an error gives the
// message back uncounted (nil still acks). The handler must not ack, nack
// or fail the lease itself. "No other worker is handed it" holds while the
// lease does: the runtime cancels ctx the moment the lease lapses by this
// process's clock (its heartbeats failed), before the database could hand
// it out.
type Handler func(ctx context.Context, lease *Lease) error

// TxHandler handles one message inside a transaction, for effects that are
// rows in the queue's own database (WorkTx): applied exactly once. The
// runtime begins tx, reads the group's state (nil: none) and calls the
// handler, which writes its effects through tx and returns the group's
// new state: nil clears it, so return state to keep it (at most
// MaxStateSize). Returning a nil error acks the message, saves the new
// state and commits the handler's writes in one transaction, fenced by the
// lease: if the lease was lost meanwhile (another worker holds the group)
// the transaction is rolled back instead and nothing of this attempt is
// applied; the group's next holder applies the message. An error (or a
// panic) rolls tx back and fails the attempt as a Handler's error does
// (retries, dead letters); so does a new state over MaxStateSize
// (ErrStateTooLarge) or a transaction the handler left unusable.
//
// ctx is a Handler's: cancelled when the lease is lost, which also aborts
// the statement tx is running, and at the end of a graceful shutdown's
// ShutdownTimeout (an error then rolls back and gives the message back
// uncounted). DeadLetterNow and Snooze work as for a Handler: tx is rolled
// back, so none of the handler's writes and no new state commit, and then
// the message is dead-lettered or its group parked in a transaction of its
// own. Use tx only within the call: do not commit or roll it back,
// and do not ack, nack or fail the lease. The heartbeats keep the lease
// while the handler runs, however long.
type TxHandler func(ctx context.Context, tx pgx.Tx, lease *Lease, state []byte) (newState []byte, err error)

// WorkerConfig configures a handler runtime (the Work method of either
// transport). The zero value works.
type WorkerConfig struct {
	// WorkerID prefixes the leases' tokens: "" means hostname:pid. Run one
	// runtime per process, with the Concurrency it needs, rather than many
	// small ones.
	WorkerID string
	// Concurrency is the most handlers that run at once: 0 means
	// DefaultConcurrency; at most MaxBatch. The runtime holds at most this
	// many leases (the blocking runtime needs a pool connection per
	// handler slot to run at full speed, plus one for heartbeats).
	Concurrency int
	// Visibility is each lease's length: 0 means DefaultWorkerVisibility;
	// at least MinVisibility. It bounds how long a message of a crashed
	// worker waits before it is handed out again, not how long a handler
	// may run: the runtime extends the leases of running handlers every
	// third of it (one round-trip for all of them).
	Visibility time.Duration
	// MinPriority is the priority floor: only groups at or above it.
	MinPriority int
	// ShutdownTimeout is how long a shutdown lets running handlers finish
	// before it cancels their ctx: 0 means DefaultShutdownTimeout. For a
	// hard stop pass a short one.
	ShutdownTimeout time.Duration
}

// DeadLetterNow wraps a handler's error to say that its message can never
// succeed: the runtime (or a Fail given it) moves the message to the dead
// letters at once with cause's text, whatever attempts it has left and
// whatever the queue's OnExhausted says, and the group goes on with its
// next message. Retrying a malformed event would only hold its group for
// the whole backoff; lowering MaxAttempts would change the whole queue.
func DeadLetterNow(cause error) error { return &DeadLetterError{Cause: cause} }

// DeadLetterError is DeadLetterNow's error; errors.As finds it.
type DeadLetterError struct{ Cause error }

func (e *DeadLetterError) Error() string {
	if e.Cause == nil {
		return "pgtransport: dead-letter now"
	}
	return "pgtransport: dead-letter now: " + e.Cause.Error()
}

func (e *DeadLetterError) Unwrap() error { return e.Cause }

// Snooze is a handler's result that ends the attempt without counting it
// and parks the message's group for d: the message stays its head and is
// handed out again (to any worker) once d has passed, with the attempt
// number it had; the group's other messages wait behind it, in order. d
// of 0 frees the group at once. A Fail given Snooze(d) does the same, and
// refuses a negative d (ErrInvalidDelay, nothing changed); a runtime then
// fails the message as an ordinary error. Wrapped in DeadLetterNow, or
// wrapping it, the outermost of the two decides. Use
// it for a message that cannot be handled yet (a resource not ready, a
// rate limit): unlike a returned error, it burns no attempt.
func Snooze(d time.Duration) error { return &SnoozeError{Delay: d} }

// SnoozeError is Snooze's error; errors.As finds it.
type SnoozeError struct{ Delay time.Duration }

func (e *SnoozeError) Error() string { return fmt.Sprintf("pgtransport: snooze for %v", e.Delay) }
