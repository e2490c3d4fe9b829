// Package async is the channel-based transport: one Transport type over a
// queue of N ≥ 1 partitions (New and FromDSN: one database; NewCluster
// and OpenCluster: partitions, docs/partitions.md), with the methods of
// package sync, each returning a channel that delivers its one result,
// and a Stream that delivers leases to a select loop as work appears. Over
// partitions a Stream merges a stream per partition, each with its share
// of StreamConfig.MaxInFlight.
//
// Pick sync for a worker loop that claims, handles and acks in turn, one
// goroutine per worker. Pick async when the consumer is a select loop, when
// idle consumers should wake at once on new work (LISTEN/NOTIFY, see package
// notify) instead of polling, or when one goroutine drives many leases at
// once (StreamConfig.MaxInFlight). The settings only async uses are in
// Config.Async (pgtransport.AsyncConfig).
//
// Every goroutine the package starts belongs to a Transport, and Close
// stops it and waits for it; a Stream's also stop with the Stream's Close.
//
// The guarantees (ordering, one holder per group, fencing, attempts and
// dead letters, exactly-once effects, lost replies, what a Stream gives
// back, who closes which channel, what spans partitions) are written once,
// in the package documentation of [github.com/pgtransport/pgtransport].
package async
