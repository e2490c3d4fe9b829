// Package sync is the blocking transport: every method returns when it is
// done, and all but ClaimWait (which waits for work) are one round-trip to
// PostgreSQL. A Transport starts no goroutines; a Cluster's calls that
// span partitions run one per partition and wait for them before they
// return.
//
// The package name shadows the standard library's; import it as
//
//	import pgsync "github.com/pgtransport/pgtransport/sync"
//
// # Guarantees
//
//   - FIFO per group: a group's messages are handed out one at a time, in
//     publish order: a message whose publish returned before another's
//     began is handed out first. (Publishes racing into one group from two
//     transactions are ordered by their commits.)
//   - One holder per group: while a lease on a group holds, no other claim
//     returns any message of that group; workers lease different groups in
//     parallel (FOR NO KEY UPDATE SKIP LOCKED, no global lock).
//   - At least once: a published message is handed out until it is acked,
//     or dead-lettered once it has used the queue's attempts
//     (Config.MaxAttempts; Lease.Attempt counts them). A lease that is
//     neither acked nor nacked lapses after its visibility, and the same
//     message (still the head) goes to the next claimer; that counts as an
//     attempt.
//   - Poison messages never block their group for good: Fail parks the
//     group for a growing backoff, and the attempt that uses the last one
//     dead-letters the head (the group goes on) or, by the queue's policy,
//     stops the group until RestartGroup.
//   - Fencing: Ack, Nack, Fail and Extend act only while the lease's token
//     still holds its group; otherwise they return ErrLeaseLost and change
//     nothing.
//   - Idempotent publish: a Message.DedupKey seen for its group within
//     Config.DedupWindow stores nothing and returns the first seq.
//   - Round-robin: a claim takes the group served longest ago; groups never
//     served come first.
//
// A claim whose context is cancelled while the statement runs may still have
// leased a message on the server: the caller never sees that lease, and the
// message comes back when its visibility runs out.
//
// # Partitions
//
// Cluster is the same API over a queue spread over several databases
// behind a PL/Proxy proxy (OpenCluster reads the map from the proxy, then
// talks to each partition directly). The guarantees above hold within a
// group, which lives on one partition; see Cluster for what spans
// partitions (claims try each in turn, batches are atomic per partition,
// a caller's transaction must be on the group's partition).
package sync
