package async_test

import (
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
)

// TestAckNextOnStreamLease: a stream's lease settled with AckNext stays the
// stream's: the next message it returns can be acked (through the stream's
// batch), and its slot is then free for the next group.
func TestAckNextOnStreamLease(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, db := setup(t, pgtransport.Config{})
	is.NoErr((<-tr.Publish(ctx(t), "g", "e1", 0)).Err)
	is.NoErr((<-tr.Publish(ctx(t), "g", "e2", 0)).Err)
	s := stream(t, tr, async.StreamConfig{MaxInFlight: 1})
	l := receive(t, s, time.Minute)
	is.Equal(l.Event, "e1")
	r := <-tr.AckNext(ctx(t), l, time.Minute)
	is.NoErr(r.Err)
	is.True(r.Value != nil)             // kept
	is.Equal(r.Value.Event, "e2")       // the group's next message
	is.NoErr(<-tr.Ack(ctx(t), r.Value)) // the kept lease acks
	is.Equal(count(t, db, `SELECT count(*) FROM transport_messages`), 0)
	is.NoErr((<-tr.Publish(ctx(t), "h", "e", 0)).Err)
	is.Equal(receive(t, s, time.Minute).Group, "h") // the slot came free
}

// TestStreamsShareATransport: with two streams on one Transport, each ack
// reaches the stream that holds the lease and frees its slot there.
func TestStreamsShareATransport(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, db := setup(t, pgtransport.Config{})
	mk := func(worker string) *async.Stream {
		s, err := tr.Stream(ctx(t), async.StreamConfig{WorkerID: worker, Visibility: time.Minute, MaxInFlight: 1})
		is.NoErr(err)
		t.Cleanup(s.Close)
		return s
	}
	a, b := mk("a"), mk("a:b") // a worker ID that prefixes the other's tokens
	const n = 20
	for i := range n {
		is.NoErr((<-tr.Publish(ctx(t), string(rune('A'+i)), "e", 0)).Err)
	}
	for got := 0; got < n; got++ {
		var l *pgtransport.Lease
		select {
		case l = <-a.C():
		case l = <-b.C():
		case <-time.After(time.Minute):
			t.Fatalf("got %d of %d", got, n)
		}
		is.NoErr(<-tr.Ack(ctx(t), l)) // each ack frees its own stream's one slot
	}
	is.Equal(count(t, db, `SELECT count(*) FROM transport_messages`), 0)
}
