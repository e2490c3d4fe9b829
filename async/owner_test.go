package async_test

import (
	"errors"
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

// TestStaleAckManyKeepsTheSlot: acking again, through AckMany, a message a
// stream already acked and kept its group for (the next message waits in C
// under the same key) answers ErrLeaseLost and leaves the stream's slot
// taken: the stream must not claim a second group past MaxInFlight (it
// would block on the full C, and Close with it).
func TestStaleAckManyKeepsTheSlot(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, db := setup(t, pgtransport.Config{})
	is.NoErr((<-tr.Publish(ctx(t), "g", "e1", 0)).Err)
	is.NoErr((<-tr.Publish(ctx(t), "g", "e2", 0)).Err)
	s := stream(t, tr, async.StreamConfig{MaxInFlight: 1})
	first := receive(t, s, time.Minute)
	is.NoErr(<-tr.Ack(ctx(t), first)) // the stream keeps g: e2 goes to C, unreceived
	eventually(t, time.Minute, "e2 in C", func() bool { return len(s.C()) == 1 })
	r := <-tr.AckMany(ctx(t), []*pgtransport.Lease{first})
	is.NoErr(r.Err)
	is.True(errors.Is(r.Value[0], pgtransport.ErrLeaseLost)) // acked already
	is.NoErr((<-tr.Publish(ctx(t), "h", "e", 0)).Err)        // wakes the stream, were it to have room
	locked := `SELECT count(*) FROM transport_groups WHERE locked_by IS NOT NULL`
	// Nothing signals a claim that does not happen: give the stream the
	// time a wrong claim takes (it would be woken by the publish above).
	most := 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && most <= 1; {
		most = max(most, count(t, db, locked))
		time.Sleep(5 * time.Millisecond)
	}
	is.Equal(most, 1) // g only: h was never claimed past MaxInFlight
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Stream.Close still blocked after 30s")
	}
}
