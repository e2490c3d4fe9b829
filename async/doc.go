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
// Every goroutine the package starts belongs to a Transport, and Close stops
// it and waits for it.
package async
