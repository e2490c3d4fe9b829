package async_test

import (
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// TestClusterCloseEndsItsStreams: a Stream over partitions whose receiver stopped
// receiving holds leases (in its partitions' streams and its forwarders);
// closing the Transport ends it, closes C, and gives every undelivered lease
// back, not counted as an attempt.
func TestClusterCloseEndsItsStreams(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Partitions(t, 4)
	c, err := async.NewCluster(ctx(t), p.Parts, pgtransport.Config{})
	is.NoErr(err)
	perPart := map[int]int{} // 4 groups on each partition: as many as its stream's share
	for g := 0; len(perPart) < 4 || slices.Min(slices.Collect(maps.Values(perPart))) < 4; g++ {
		name := fmt.Sprint("s", g)
		if i := c.Home(name); perPart[i] < 4 {
			perPart[i]++
			is.NoErr((<-c.Publish(ctx(t), name, "e", 0)).Err)
		}
	}
	s, err := c.Stream(ctx(t), async.StreamConfig{WorkerID: "w", Visibility: time.Minute, MaxInFlight: 16})
	is.NoErr(err)
	first := <-s.C() // received, not settled: held
	is.True(first != nil)
	for held := 0; held < 16; { // every other lease claimed, waiting for a receiver
		time.Sleep(20 * time.Millisecond) // kept: the streams claim meanwhile
		held = 0
		for _, part := range p.Parts {
			var n int
			is.NoErr(part.QueryRow(ctx(t), `SELECT count(*) FROM transport_groups WHERE locked_by IS NOT NULL`).Scan(&n))
			held += n
		}
	}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		c.Close()
		for l := range s.C() { // closed by the Transport's Close
			t.Errorf("a lease delivered after Close: %s", l.Group)
		}
	}()
	select {
	case <-closed:
	case <-time.After(20 * time.Second): // the leases' give-back time is 30 s away: not that
		t.Fatal("Close has not ended the stream 20 s on")
	}
	leased, attempted := 0, 0
	for _, part := range p.Parts {
		var l, a int
		is.NoErr(part.QueryRow(ctx(t), `SELECT count(*) FILTER (WHERE locked_by IS NOT NULL AND lock_expiry > extract(epoch FROM clock_timestamp())), count(*) FILTER (WHERE attempts > 0) FROM transport_groups`).Scan(&l, &a))
		leased, attempted = leased+l, attempted+a
	}
	is.Equal(leased, 1)    // only the received lease still holds its group
	is.Equal(attempted, 1) // and only its hand-out counts
}

// claimCounter is an Observer that counts the leases claimed.
type claimCounter struct {
	pgtest.Observer
	n atomic.Int64
}

func (c *claimCounter) Claimed(n int, d time.Duration, err error) { c.n.Add(int64(n)) }

// TestMergedStreamHoldsBackUnreceived: over partitions, a Stream whose
// receiver takes nothing gives each lease back at half its visibility and
// then holds its claims back (the gate), as on one database, instead of
// claiming the same groups again every half visibility: in 4.5 s at a
// visibility of 2 s it claims its slots and then probes a lease at a time
// per partition (24 measured alone, 29 once in a loaded CI run), not its
// slots every second (40 without the gate).
func TestMergedStreamHoldsBackUnreceived(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Partitions(t, 2)
	var obs claimCounter
	c, err := async.NewCluster(ctx(t), p.Parts, pgtransport.Config{Observer: &obs, IdleSweep: time.Second})
	is.NoErr(err)
	defer c.Close()
	for g := range 40 {
		is.NoErr((<-c.Publish(ctx(t), fmt.Sprint("u", g), "e", 0)).Err)
	}
	s, err := c.Stream(ctx(t), async.StreamConfig{WorkerID: "w", Visibility: 2 * time.Second, MaxInFlight: 8})
	is.NoErr(err)
	defer s.Close()
	time.Sleep(4500 * time.Millisecond) // kept: the case is what the stream claims while nobody receives
	claimed := obs.n.Load()
	t.Logf("claimed %d leases in 4.5 s with no receiver (8 slots)", claimed)
	is.True(claimed >= 8)  // it claimed its slots
	is.True(claimed <= 32) // and held back after the give-backs: without the gate, 8 every second
}
