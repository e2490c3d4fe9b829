// Package async is the channel-based twin of package sync: the same
// operations on the same server-side functions, each returning a channel
// that delivers its one result, plus a Stream that delivers leases to a
// select loop as work appears.
//
// Pick sync for a worker loop that claims, handles and acks in turn, one
// goroutine per worker. Pick async when the consumer is a select loop, when
// idle consumers should wake at once on new work (LISTEN/NOTIFY, see package
// notify) instead of polling, or when one goroutine drives many leases at
// once (StreamConfig.MaxInFlight).
//
// The guarantees are package sync's (see its doc): FIFO per group, one
// holder per group, at least once with attempts counted and poison
// messages dead-lettered or their group stopped by the queue's policy,
// fencing, idempotent publish. A Stream gives back a lease nobody received
// without counting it as an attempt; a lease it delivered leaves its count
// of leases in flight once acked, nacked or failed through the Transport.
//
// Every goroutine the package starts belongs to a Transport, and Close stops
// it and waits for it (a ClusterStream's, to the stream: its Close).
//
// Cluster is the same API over a queue spread over several databases
// behind a PL/Proxy proxy, as sync.Cluster: a Transport per partition,
// each with its pool, listener and streams; a ClusterStream merges a
// stream per partition, each with its share of MaxInFlight.
package async
