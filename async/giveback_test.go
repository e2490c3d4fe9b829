package async_test

import (
	"errors"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
)

// TestStreamGiveBackDoesNotCount: the leases a stream claimed that nobody
// received are given back when it closes, free at once and not counted:
// the next claim of each is its first attempt (a nack would have made it
// the second).
func TestStreamGiveBackDoesNotCount(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, st, db := setup(t, pgtransport.Config{})
	for _, g := range []string{"a", "b"} {
		_, err := st.Publish(ctx(t), g, g+"1", 0)
		is.NoErr(err)
	}
	s := stream(t, tr, async.StreamConfig{MaxInFlight: 2})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var held int
		is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT count(*) FROM transport_groups WHERE locked_by LIKE 'w:%'`).Scan(&held))
		if held == 2 {
			break // both claimed, waiting in C
		}
		if time.Now().After(deadline) {
			t.Fatal("the stream never claimed both groups")
		}
	}
	s.Close() // gives back what waits in C
	ls, err := st.ClaimMany(ctx(t), "w2", time.Minute, 0, 10)
	is.NoErr(err)
	is.Equal(len(ls), 2) // free at once
	for _, l := range ls {
		is.Equal(l.Attempt, 1) // the give-back did not count
	}
}

// TestStreamLeasesCountAttempts: a stream's leases carry the attempt: a
// nacked head comes back as the second, and the next message a kept lease
// delivers is its first.
func TestStreamLeasesCountAttempts(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, st, _ := setup(t, pgtransport.Config{})
	for _, ev := range []string{"m1", "m2"} {
		_, err := st.Publish(ctx(t), "g", ev, 0)
		is.NoErr(err)
	}
	s := stream(t, tr, async.StreamConfig{})
	l := receive(t, s, 30*time.Second)
	is.Equal(l.Event, "m1")
	is.Equal(l.Attempt, 1)
	is.True(!l.PublishedAt.IsZero())
	is.NoErr(<-tr.Nack(ctx(t), l, 0))
	l = receive(t, s, 30*time.Second)
	is.Equal(l.Event, "m1")
	is.Equal(l.Attempt, 2) // the nacked hand-out counted
	is.NoErr(<-tr.Ack(ctx(t), l))
	l = receive(t, s, 30*time.Second)
	is.Equal(l.Event, "m2")
	is.Equal(l.Attempt, 1)
	is.True(!l.PublishedAt.IsZero())
	is.NoErr(<-tr.Ack(ctx(t), l))
}

// TestStreamFailFreesItsSlot: a Fail of a lease the stream delivered ends
// it for the stream as an ack would: with MaxInFlight 1, the next group's
// lease comes at once, not after the failed lease's visibility.
func TestStreamFailFreesItsSlot(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, st, _ := setup(t, pgtransport.Config{})
	for _, g := range []string{"a", "b"} {
		_, err := st.Publish(ctx(t), g, g+"1", 0)
		is.NoErr(err)
	}
	s := stream(t, tr, async.StreamConfig{MaxInFlight: 1, Visibility: time.Hour})
	l := receive(t, s, 30*time.Second)
	is.NoErr(<-tr.Fail(ctx(t), l, errors.New("boom")))
	next := receive(t, s, 30*time.Second) // within the hour only if the slot was freed
	is.True(next.Group != l.Group)        // the failed one waits out its backoff
}
