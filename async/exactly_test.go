package async_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
)

// TestAckTxLeavesTheStream: a lease a stream delivered and AckTx acked
// leaves the stream: its slot is free for the next claim (with
// MaxInFlight 1 the stream delivers another lease while the caller's
// transaction is still open), and the stream neither acks it nor gives it
// back. Rolled back, the lease holds outside the stream, and a plain Ack
// settles it. An Ack queued in the stream makes a later AckTx
// ErrLeaseLost, as a second ack.
func TestAckTxLeavesTheStream(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, db := setup(t, pgtransport.Config{})
	for _, g := range []string{"a", "b", "c"} {
		is.NoErr((<-tr.Publish(ctx(t), g, g+"-0", 0)).Err)
	}
	s, err := tr.Stream(ctx(t), async.StreamConfig{WorkerID: "s", Visibility: time.Minute, MaxInFlight: 1})
	is.NoErr(err)
	t.Cleanup(s.Close)
	recv := func() *pgtransport.Lease {
		t.Helper()
		select {
		case l := <-s.C():
			return l
		case <-time.After(10 * time.Second):
			t.Fatal("no lease from the stream")
			return nil
		}
	}

	first := recv()
	tx, err := db.Pool.Begin(ctx(t))
	is.NoErr(err)
	is.NoErr(<-tr.AckTx(ctx(t), tx, first))
	second := recv() // the slot came free at the AckTx, before the commit
	is.True(second.Group != first.Group)
	is.NoErr(tx.Rollback(ctx(t)))                                         // the first lease holds as before, outside the stream
	is.NoErr(<-tr.Ack(ctx(t), first))                                     // and is settled by a plain Ack
	is.True(errors.Is(<-tr.Ack(ctx(t), first), pgtransport.ErrLeaseLost)) // once

	is.NoErr(<-tr.Ack(ctx(t), second)) // queued in the stream
	tx, err = db.Pool.Begin(ctx(t))
	is.NoErr(err)
	defer tx.Rollback(context.Background())
	err = <-tr.AckTx(ctx(t), tx, second)
	is.True(errors.Is(err, pgtransport.ErrLeaseLost)) // its ack is on its way already

	third := recv()
	tx2, err := db.Pool.Begin(ctx(t))
	is.NoErr(err)
	is.NoErr(<-tr.AckStateTx(ctx(t), tx2, third, []byte("s")))
	is.NoErr(tx2.Commit(ctx(t)))
	var n int
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT count(*) FROM transport_messages`).Scan(&n))
	is.Equal(n, 0) // every message acked once
	s.Close()      // gives back nothing: the stream holds no lease
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT count(*) FROM transport_groups WHERE drained_at IS NULL`).Scan(&n))
	is.Equal(n, 0)
}
