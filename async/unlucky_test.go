package async_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// answered waits for an ack's answer.
func answered(t *testing.T, done <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no answer within 30s", what)
		return nil
	}
}

// TestRefusedAckAnsweredAlone: the database refuses one ack for good (a
// trigger stands in for any refusal: a lease the server will not settle).
// That ack is answered the refusal, alone; the acks batched with it settle,
// and the stream goes on delivering.
func TestRefusedAckAnsweredAlone(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, db := setup(t, pgtransport.Config{})
	_, err := db.Pool.Exec(ctx(t), `
CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'this message may not be deleted' USING ERRCODE = '22000'; END $$;
CREATE TRIGGER refuse_bad BEFORE DELETE ON transport_messages
   FOR EACH ROW WHEN (OLD.group_id = 'bad') EXECUTE FUNCTION refuse_bad();`)
	is.NoErr(err)
	for _, g := range []string{"bad", "a1", "a2", "a3"} {
		is.NoErr((<-tr.Publish(ctx(t), g, g, 0)).Err)
	}
	s := stream(t, tr, async.StreamConfig{MaxInFlight: 4})
	var got []*pgtransport.Lease
	for range 4 {
		got = append(got, receive(t, s, time.Minute))
	}
	dones := make([]<-chan error, len(got))
	for i, l := range got { // at once: they share round-trips
		dones[i] = tr.Ack(ctx(t), l)
	}
	for i, l := range got {
		err := answered(t, dones[i], "ack of "+l.Group)
		if l.Group == "bad" {
			is.True(err != nil)                                // refused
			is.True(!errors.Is(err, pgtransport.ErrLeaseLost)) // and not "lost"
		} else {
			is.NoErr(err) // settled, though batched with the refused one
		}
	}
	for i := range 10 {
		is.NoErr((<-tr.Publish(ctx(t), fmt.Sprintf("later-%d", i), "e", 0)).Err)
	}
	for range 10 { // three slots: the refused lease still holds one
		l := receive(t, s, 30*time.Second)
		is.NoErr(answered(t, tr.Ack(ctx(t), l), "ack of "+l.Group))
	}
	is.Equal(count(t, db, `SELECT count(*) FROM transport_messages`), 1) // bad's, refused
}

// TestLostAckReplyStream: an ack through a stream whose round-trip commits
// and then loses its reply (the connection cut after the commit) is
// retried; the retry finds the lease gone, and the stream must not call
// the ack lost: the message is deleted and will never come back. While the
// lease could not have lapsed, that proves the first attempt applied it.
func TestLostAckReplyStream(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	p := pgtest.NewProxy(t)
	tr := open(t, p.Pool(t, db, 8), pgtransport.Config{Schema: db.Schema})
	s := stream(t, tr, async.StreamConfig{MaxInFlight: 1})
	const n = 12
	for i := range n {
		g := fmt.Sprintf("lost-%02d", i)
		is.NoErr((<-tr.Publish(ctx(t), g, "e", 0)).Err)
		l := receive(t, s, time.Minute)
		is.Equal(l.Group, g)
		p.CutAfterCommit(g) // the ack's round-trip: the only request naming g now
		err := answered(t, tr.Ack(ctx(t), l), "ack of "+g)
		is.Equal(p.Lost(), i+1) // its reply was lost indeed
		is.NoErr(err)           // applied, and said so
		is.Equal(count(t, db, `SELECT count(*) FROM transport_messages WHERE group_id = $1`, g), 0)
	}
}

// TestGivenBackGoesToOthers: a stream whose only receiver is stuck on one
// lease gives the others back after half their visibility; it must not
// take them straight back, so another consumer polling gets them.
func TestGivenBackGoesToOthers(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, db := setup(t, pgtransport.Config{})
	other, err := pgsync.New(ctx(t), db.Pool, pgtransport.Config{Schema: db.Schema, SkipApply: true})
	is.NoErr(err)
	const groups = 5
	for i := range groups {
		is.NoErr((<-tr.Publish(ctx(t), fmt.Sprintf("g%d", i), "e", 0)).Err)
	}
	start := time.Now()
	s := stream(t, tr, async.StreamConfig{MaxInFlight: groups, Visibility: 3 * time.Second})
	stuck := receive(t, s, time.Minute) // the receiver takes one and works on it for long
	eventually(t, 30*time.Second, "the stream holds every group", func() bool {
		return len(s.C()) == groups-1
	})
	// The other consumer polls every 10 ms (the leases in C are given back
	// after 1.5 s), until just before the receiver's lease could lapse,
	// and keeps what it gets.
	var took []string
	for deadline := start.Add(2500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		l, err := other.Claim(ctx(t), "other", time.Minute, 0)
		is.NoErr(err)
		if l != nil {
			took = append(took, l.Group)
		}
	}
	t.Logf("the other consumer took %v of the %d given back", took, groups-1)
	is.True(len(took) >= groups-2) // most of them: the stream did not take them back
	for _, g := range took {
		is.True(g != stuck.Group) // never the one the receiver holds
	}
}
