package async_test

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// TestStreamReconnectLogged: a stream round-trip that loses its connection
// (the reply cut after the commit) is logged at Warn, and the retry that
// gets through at Info; the busy work around it logs nothing.
func TestStreamReconnectLogged(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	p := pgtest.NewProxy(t)
	logs := &pgtest.Logs{Level: slog.LevelInfo}
	tr := open(t, p.Pool(t, db, 8), pgtransport.Config{Schema: db.Schema, Logger: logs.Logger()})
	s := stream(t, tr, async.StreamConfig{MaxInFlight: 4})
	for i := range 20 { // a busy stretch: nothing logged
		is.NoErr((<-tr.Publish(ctx(t), fmt.Sprint("g", i%5), "e", 0)).Err)
	}
	for range 20 {
		is.NoErr(answered(t, tr.Ack(ctx(t), receive(t, s, time.Minute)), "ack"))
	}
	is.Equal(len(logs.Records()), 0)

	is.NoErr((<-tr.Publish(ctx(t), "cut", "e", 0)).Err)
	l := receive(t, s, time.Minute)
	is.Equal(l.Group, "cut")
	p.CutAfterCommit("cut") // the ack's round-trip loses its reply
	is.NoErr(answered(t, tr.Ack(ctx(t), l), "ack of cut"))
	is.Equal(p.Lost(), 1)
	down := logs.Find(slog.LevelWarn, "stream: database call failed")
	is.Equal(len(down), 1) // the failure, once
	v, _ := pgtest.Attr(down[0], "worker")
	is.Equal(v.String(), "w")
	eventually(t, 30*time.Second, "the recovery logged", func() bool {
		return len(logs.Find(slog.LevelInfo, "stream: database reachable again")) == 1
	})
	// The retry found the lease gone because the first try applied it
	// (the stream proves it): not a lost lease.
	is.Equal(len(logs.Find(slog.LevelWarn, "lease lost")), 0)
	is.Equal(len(logs.Records()), 2) // the failure and the recovery: nothing else
}

// TestStreamObserved: a stream's claims and acks reach the observer with
// their counts (every message once each way), and an ack the stream itself
// finds lost (a second ack of one lease) is reported and logged at Warn.
func TestStreamObserved(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	obs := &pgtest.Observer{}
	logs := &pgtest.Logs{Level: slog.LevelInfo}
	tr, _, _ := setup(t, pgtransport.Config{Observer: obs, Logger: logs.Logger()})
	const n = 30
	var msgs []pgtransport.Message
	for i := range n {
		msgs = append(msgs, pgtransport.Message{Group: fmt.Sprint("g", i%7), Event: fmt.Sprint(i)})
	}
	is.NoErr((<-tr.PublishMany(ctx(t), msgs)).Err)
	s := stream(t, tr, async.StreamConfig{MaxInFlight: 8})
	var last *pgtransport.Lease
	for range n {
		last = receive(t, s, time.Minute)
		is.NoErr(answered(t, tr.Ack(ctx(t), last), "ack"))
	}
	sum := func(method string) (total int) {
		for _, c := range obs.Calls(method) {
			is.NoErr(c.Err)
			is.True(c.D > 0)
			total += c.N
		}
		return total
	}
	is.Equal(sum("Published"), n)
	is.Equal(sum("Acked"), n)
	// Claimed counts every hand-out: fresh claims, and a kept group's
	// next message, which comes with its ack. Each message was handed out
	// once.
	is.Equal(sum("Claimed"), n)
	is.Equal(len(obs.Calls("LeaseLost")), 0)
	is.Equal(len(logs.Records()), 0) // healthy: nothing logged

	is.NoErr((<-tr.Publish(ctx(t), "twice", "e", 0)).Err)
	l := receive(t, s, time.Minute)
	first := tr.Ack(ctx(t), l)
	second := tr.Ack(ctx(t), l) // its ack is on its way: this one is lost
	is.NoErr(answered(t, first, "first ack"))
	is.True(errors.Is(answered(t, second, "second ack"), pgtransport.ErrLeaseLost))
	lost := obs.Calls("LeaseLost")
	is.Equal(len(lost), 1)
	is.Equal(lost[0].Lease, l)
	is.Equal(len(logs.Find(slog.LevelWarn, "lease lost")), 0) // this process settled it: not a warning
}
