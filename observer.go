package pgtransport

import "time"

// Failure outcomes an Observer's Failed reports: what the queue did with
// the failed message.
const (
	// OutcomeRetry: the message stays its group's head, and the group is
	// parked for the retry backoff.
	OutcomeRetry = "retry"
	// OutcomeDead: the message was moved to the dead letters: it used its
	// attempts (Exhausted DeadLetterHead), or its cause was DeadLetterNow's.
	OutcomeDead = "dead"
	// OutcomeSnoozed: its cause was Snooze's: the group is parked, the
	// attempt not counted.
	OutcomeSnoozed = "snoozed"
	// OutcomeStopped: the message used its attempts and its group was
	// stopped (Exhausted StopGroup).
	OutcomeStopped = "stopped"
)

// Observer is told of every publish, claim, ack and fail a transport makes,
// every lease it finds lost, and every message the handler runtime
// handles, with how long each took: the hook for metrics (count the calls,
// sum n, histogram d), so a metrics library plugs in without this module
// importing it. Config.Observer nil means none, and then the transport
// calls none and reads no clock for one (the handler runtime times each
// handler anyway, for its own use).
//
// Calls come from the goroutines doing the work, concurrently, on the hot
// path: a method must be safe for concurrent use, must not block, and must
// not call the transport. It must not keep or change the *Lease it is
// passed. d is the duration of the call, mostly its round-trip to the
// database (for Handled, the handler's run); err is the call's error, nil
// on success. A publish, claim, ack or fail refused before anything was
// sent (a bad argument, a ctx already ended) is mostly reported too, with
// its error (not a batch of the wrong size, nor AckNext's bad lease). A publish inside a caller's transaction is reported when it is
// written, whether or not that transaction commits.
type Observer interface {
	// Published: a publish of n messages (1 for Publish, the batch's size
	// for PublishMany; n counts messages a dedup key held back too).
	Published(n int, d time.Duration, err error)
	// Claimed: a claim that handed out n leases (0: nothing was
	// claimable), including a stream's claims, the claims an exchange
	// (ack and claim in one round-trip) makes, and the leases an ack kept
	// for its group's next message (AckNext, a stream's or the runtime's
	// keep): n counts every message handed out.
	Claimed(n int, d time.Duration, err error)
	// Acked: an ack of n leases (an AckNext, AckMany or a stream's
	// batched ack). Leases found lost are counted in n too, and reported
	// to LeaseLost.
	Acked(n int, d time.Duration, err error)
	// Failed: a Fail of l; outcome is OutcomeRetry, OutcomeDead, OutcomeSnoozed or
	// OutcomeStopped, "" when err is not nil.
	Failed(l *Lease, outcome string, d time.Duration, err error)
	// LeaseLost: l no longer held its group when an ack, nack, fail,
	// extend or heartbeat was sent for it (ErrLeaseLost).
	LeaseLost(l *Lease)
	// Handled: the handler runtime ran its handler on l for d, which
	// returned err (a panic is reported as an error).
	Handled(l *Lease, d time.Duration, err error)
}
