package main

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// BenchmarkPublishNotify: 16 publishers, each publishing workflows of
// "events" events to a group of their own (so every publish, or every
// third, creates a group), while one async consumer works through a backlog
// and acks. Modes:
//
//	off:    the consumer has notifications off (Config.Async.DisableNotify).
//	on:     notifications on; publishers notify only while the consumer waits.
//	always: as on, plus a waiter row that never lapses, so every new group
//	        notifies: what notifying on every new group would cost.
func BenchmarkPublishNotify(b *testing.B) {
	for _, events := range []int{1, 3} {
		for _, mode := range []string{"off", "on", "always"} {
			b.Run(fmt.Sprintf("events=%d/mode=%s/publishers=16", events, mode), func(b *testing.B) {
				publishNotify(b, mode, 16, events)
			})
		}
	}
}

func publishNotify(b *testing.B, mode string, publishers, events int) {
	db := pgtest.New(b, int32(publishers)+8)
	ctx := context.Background()
	cfg := pgtransport.Config{Schema: db.Schema, Async: pgtransport.AsyncConfig{DisableNotify: mode == "off"}}
	pub, err := pgsync.New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema}) // the blocking publisher takes no async settings
	if err != nil {
		b.Fatal(err)
	}
	consumerDB := pgtest.New(b, 4) // its own pool, so its listener is its own
	cons, err := async.New(ctx, consumerDB.Pool, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer cons.Close()
	if mode == "always" {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO transport_waiters VALUES ('forever', 0, 'infinity')`); err != nil {
			b.Fatal(err)
		}
	}
	s, err := cons.Stream(ctx, async.StreamConfig{WorkerID: "consumer", Visibility: time.Minute, MaxInFlight: 8})
	if err != nil {
		b.Fatal(err)
	}
	<-s.Ready()
	notes := countNotifications(b, db)
	var (
		acked    atomic.Int64
		orderErr = make(chan error, 1)
		drained  = make(chan struct{})
		firstAck = make(chan struct{})
		lastSeq  = map[string]int64{}
	)
	go func() { // the consumer: check per-group order, ack
		defer close(drained)
		for l := range s.C() {
			if l.Seq <= lastSeq[l.Group] {
				select {
				case orderErr <- fmt.Errorf("group %s: seq %d after %d", l.Group, l.Seq, lastSeq[l.Group]):
				default:
				}
			}
			lastSeq[l.Group] = l.Seq
			if err := <-cons.Ack(ctx, l); err == nil && acked.Add(1) == 1 {
				close(firstAck)
			}
		}
	}()
	// Warm up: a backlog the consumer is working through when the timing
	// starts, so it does the same work in every mode (asleep until its
	// sweep, it would leave the publishers more CPU with notifications off).
	const backlog = 1000
	if _, err := db.Pool.Exec(ctx, `SELECT harel_publish('warm-' || i, 'e', 0) FROM generate_series(1, $1) AS i`, backlog); err != nil {
		b.Fatal(err)
	}
	select {
	case <-firstAck: // the consumer is working through the backlog
	case <-time.After(time.Minute):
		b.Fatal("the consumer never acked the backlog")
	}
	var next atomic.Int64 // publisher ids
	var published atomic.Int64
	published.Store(backlog)
	ackedBefore := acked.Load()
	b.SetParallelism(max(1, publishers/maxprocs()))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id := next.Add(1)
		for i := 0; pb.Next(); i++ {
			group := fmt.Sprintf("wf-%d-%d", id, i/events)
			if _, err := pub.Publish(ctx, group, fmt.Sprint(i%events), 0); err != nil {
				b.Error(err)
				return
			}
			published.Add(1)
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(float64(acked.Load()-ackedBefore)/b.Elapsed().Seconds(), "acked/s")
	b.ReportMetric(float64(notes()), "notifications")
	s.Close()
	<-drained
	select {
	case err := <-orderErr:
		b.Fatal(err)
	default:
	}
	var left int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM transport_messages`).Scan(&left); err != nil {
		b.Fatal(err)
	}
	if left+acked.Load() != published.Load() {
		b.Fatalf("published %d, acked %d, %d left: lost %d", published.Load(), acked.Load(), left, published.Load()-acked.Load()-left)
	}
}

// countNotifications listens on db's queue channel on a connection of its
// own and returns a function that stops and tells how many arrived. To
// stop, it sends a last notification of its own and counts up to it:
// PostgreSQL delivers notifications in commit order, so every one sent
// before has arrived by then.
func countNotifications(b *testing.B, db *pgtest.DB) func() int {
	ctx, cancel := context.WithCancel(context.Background())
	conn := db.Conn(b)
	var channel string
	if err := conn.QueryRow(ctx, `SELECT harel_channel()`).Scan(&channel); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{channel}.Sanitize()); err != nil {
		b.Fatal(err)
	}
	const last = "countNotifications: last"
	var n int
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			note, err := conn.WaitForNotification(ctx)
			if err != nil || note.Payload == last {
				return
			}
			n++
		}
	}()
	return func() int {
		defer cancel()
		if _, err := db.Pool.Exec(context.Background(), `SELECT pg_notify($1, $2)`, channel, last); err != nil {
			b.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(time.Minute):
			cancel()
			<-done
			b.Fatal("the last notification never arrived")
		}
		return n
	}
}

// BenchmarkWake measures how soon an idle async consumer gets work, as
// p50/p99 in ms:
//
//	notify: from the start of a Publish (by another transport, so only the
//	        notification can wake it) to the lease arriving; and, as
//	        p50-commit-ms/p99-commit-ms, from the Publish's return (its
//	        commit's reply) to the lease arriving: the wake-up alone.
//	expiry: from a lease's lock_expiry (its holder gone) to the lease
//	        arriving: no notification, the consumer's own timer.
func BenchmarkWake(b *testing.B) {
	b.Run("notify", func(b *testing.B) { wake(b, false) })
	b.Run("expiry", func(b *testing.B) { wake(b, true) })
}

func wake(b *testing.B, expiry bool) {
	db := pgtest.New(b, 4)
	ctx := context.Background()
	cfg := pgtransport.Config{Schema: db.Schema, IdleSweep: time.Minute}
	pub, err := pgsync.New(ctx, db.Pool, cfg)
	if err != nil {
		b.Fatal(err)
	}
	consumerDB := pgtest.New(b, 4)
	cons, err := async.New(ctx, consumerDB.Pool, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer cons.Close()
	s, err := cons.Stream(ctx, async.StreamConfig{WorkerID: "idle", Visibility: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	<-s.Ready()
	var lat, fromCommit []time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		if err := awaitIdle(ctx, db); err != nil {
			b.Fatal(err)
		}
		group := fmt.Sprint("g", i)
		var start, committed time.Time
		if expiry {
			start = abandon(b, db, group)
		} else {
			start = time.Now()
			if _, err := pub.Publish(ctx, group, "e", 0); err != nil {
				b.Fatal(err)
			}
			committed = time.Now()
		}
		b.StartTimer()
		l := <-s.C()
		got := time.Now()
		if l == nil || l.Group != group {
			b.Fatalf("got %+v, want group %s", l, group)
		}
		lat = append(lat, got.Sub(start))
		if !expiry {
			fromCommit = append(fromCommit, got.Sub(committed))
		}
		if err := <-cons.Ack(ctx, l); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
	b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
	if len(fromCommit) > 0 {
		slices.Sort(fromCommit)
		b.ReportMetric(ms(fromCommit[len(fromCommit)/2]), "p50-commit-ms")
		b.ReportMetric(ms(fromCommit[len(fromCommit)*99/100]), "p99-commit-ms")
	}
}

// abandon publishes to group and leases it to a holder that never
// settles, in one transaction so the consumer never sees the group free.
// The lease runs out 100 ms later: the holder's clock runs behind by the
// rest of MinVisibility, so the shortest lease allowed ends then. It
// returns when the lease runs out, by this process's clock (at or before
// the server's lock_expiry: the figure errs on the slow side).
func abandon(b *testing.B, db *pgtest.DB, group string) time.Time {
	const left = 100 * time.Millisecond
	ctx := context.Background()
	behind := func() time.Time { return time.Now().Add(left - pgtransport.MinVisibility) }
	var start time.Time
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		tr, err := pgsync.New(ctx, tx, pgtransport.Config{Schema: db.Schema, SkipApply: true, Clock: behind})
		if err != nil {
			return err
		}
		if _, err := tr.Publish(ctx, group, "e", 0); err != nil {
			return err
		}
		start = time.Now()
		_, err = tr.Claim(ctx, "gone", pgtransport.MinVisibility, 0)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return start.Add(left)
}
