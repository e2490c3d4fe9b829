// Package sync is the blocking transport: every method is one round-trip to
// PostgreSQL and returns when it is done. It starts no goroutines.
//
// The package name shadows the standard library's; import it as
//
//	import pgsync "github.com/pgtransport/pgtransport/sync"
//
// # Guarantees
//
//   - FIFO per group: a group's messages are handed out in publish order
//     (seq order), one at a time.
//   - One holder per group: while a lease on a group holds, no other claim
//     returns any message of that group; workers lease different groups in
//     parallel (FOR UPDATE SKIP LOCKED, no global lock).
//   - At least once: a published message is handed out until it is acked.
//     A lease that is neither acked nor nacked lapses after its visibility,
//     and the same message (still the head) goes to the next claimer.
//   - Fencing: Ack, Nack and Extend act only while the lease's token still
//     holds its group; otherwise they return ErrLeaseLost and change nothing.
//   - Round-robin: a claim takes the group served longest ago; groups never
//     served come first.
//
// A claim whose context is cancelled while the statement runs may still have
// leased a message on the server: the caller never sees that lease, and the
// message comes back when its visibility runs out.
package sync
