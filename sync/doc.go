// Package sync is the blocking transport: one Transport type over a queue
// of N ≥ 1 partitions (New and FromDSN: one database; NewCluster and
// OpenCluster: partitions, docs/partitions.md). Every method returns when
// it is done, most after one round-trip to PostgreSQL on one database
// (ClaimWait waits for work; Work and WorkTx run handlers until ctx ends).
// A Transport on one database starts no goroutine; over partitions, a
// call that spans them runs one goroutine per partition and waits for
// them, and ClaimWait's waits are the Transport's, ended by Close.
//
// The package name shadows the standard library's; import it as
//
//	import pgsync "github.com/pgtransport/pgtransport/sync"
//
// The guarantees (ordering, one holder per group, fencing, attempts and
// dead letters, exactly-once effects, lost replies, what spans partitions)
// are written once, in the package documentation of
// [github.com/pgtransport/pgtransport]. Package async has the same
// methods, returning channels.
package sync
