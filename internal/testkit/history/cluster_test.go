package history_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/history"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// TestClusterPartitionRestart: a queue over four partitions, partition 1
// in a throwaway cluster of its own, worked through both front-ends'
// Clusters (blocking workers that ack, nack, extend, fail or abandon
// their leases; an async stream that acks), fed by batches over every
// partition, with about 3% poison messages that fail every time (so they
// end in the dead letters after maxAttempts) and a connection of the
// queue's, on a random partition, killed every 100 ms. Mid-run partition
// 1's server is stopped for two seconds and started again. The other
// partitions' work goes on meanwhile, every pool, listener and stream
// recovers on its own, and the history holds the transport's guarantees
// (history.Check): each message acked exactly once or dead-lettered
// exactly once, first deliveries of a group in publish order, no two
// overlapping leases of a group that both settled, nothing left on any
// partition but the dead letters, which page over every partition.
func TestClusterPartitionRestart(t *testing.T) {
	t.Parallel()
	server := pgtest.PartitionServer(t)
	p := pgtest.PartitionsOn(t, 4, map[int]string{1: server.DSN()})
	app := "cluster_faults_" + p.Schema
	var pools []*pgxpool.Pool
	for _, dsn := range p.PartDSNs {
		pcfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		pcfg.MaxConns = 24
		pcfg.ConnConfig.RuntimeParams["search_path"] = p.Schema
		pcfg.ConnConfig.RuntimeParams["application_name"] = app // the killer's mark
		pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		pools = append(pools, pool)
	}
	cfg := pgtransport.Config{SkipApply: true, IdleSweep: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler), Policy: &pgtransport.Policy{MaxAttempts: maxAttempts, RetryBackoffMin: backoffMin, RetryBackoffMax: backoffMax}}
	st, err := pgsync.NewCluster(context.Background(), pools, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	at, err := async.NewCluster(context.Background(), pools, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(at.Close)

	var (
		h               history.History
		down            atomic.Bool
		acks, acksDown  atomic.Int64
		published       atomic.Int64
		partial, failed atomic.Int64
		kills, dead     atomic.Int64
	)
	const groups, total = 40, 1600
	poison := func(l *pgtransport.Lease) bool { return strings.HasSuffix(l.Event, "!fail") }
	record := func(kind history.Kind, worker string, l *pgtransport.Lease, start time.Time, err error) {
		h.Add(history.Op{Kind: kind, Worker: worker, Group: l.Group, Seq: l.Seq, Token: l.Token, Outcome: outcome(err), Start: start, End: time.Now()})
		if kind == history.Ack && err == nil {
			acks.Add(1)
			if down.Load() && l.Seq&3 != 1 {
				acksDown.Add(1)
			}
		}
	}
	run, stop := context.WithCancel(context.Background())
	defer stop()
	var wg stdsync.WaitGroup
	// The publishers end once total are published; a batch in flight then
	// still commits, so the drain below waits for them all to return
	// first (else it may stop the workers before that batch's commit).
	var pubs stdsync.WaitGroup
	for w := range 2 { // publishers: batches over every partition
		pubs.Go(func() {
			for n := 0; published.Load() < total && run.Err() == nil; n++ {
				var msgs []pgtransport.Message
				for k := range 10 {
					event := fmt.Sprintf("p%d-%d-%d", w, n, k)
					if rand.IntN(33) == 0 {
						event += "!fail"
					}
					msgs = append(msgs, pgtransport.Message{Group: fmt.Sprint("c", rand.IntN(groups)), Event: event})
				}
				start := time.Now()
				seqs, err := st.PublishMany(context.Background(), msgs)
				for k, m := range msgs {
					op := history.Op{Kind: history.Publish, Worker: fmt.Sprint("pub", w), Group: m.Group, Outcome: history.Unknown, Start: start, End: time.Now()}
					if k < len(seqs) && seqs[k] != 0 { // published: its partition answered
						op.Seq, op.Outcome = seqs[k], history.OK
						published.Add(1)
					}
					h.Add(op)
				}
				switch {
				case err != nil && len(seqs) > 0:
					partial.Add(1)
				case err != nil:
					failed.Add(1)
				}
				time.Sleep(20 * time.Millisecond) // kept: the publishers' pace, so publishing spans the restart
			}
		})
	}
	pubsDone := make(chan struct{})
	go func() { pubs.Wait(); close(pubsDone) }()
	for w := range 3 { // blocking workers
		name := fmt.Sprint("s", w)
		wg.Go(func() {
			for run.Err() == nil {
				start := time.Now()
				l, err := st.ClaimWait(run, name, time.Second, 0)
				if err != nil {
					continue // ctx ended, or every partition's first claim failed: again
				}
				record(history.Claim, name, l, start, nil)
				ctx := context.Background()
				switch r := rand.IntN(10); {
				case poison(l):
					start = time.Now()
					err := st.Fail(ctx, l, errors.New("poison"))
					record(history.Fail, name, l, start, err)
					if err == nil && l.Attempt >= maxAttempts {
						record(history.Dead, name, l, start, nil)
						dead.Add(1)
					}
				case r == 0 && l.Attempt < maxAttempts-1: // abandoned: the lease lapses
				case r == 1 && l.Attempt < maxAttempts-1:
					start = time.Now()
					record(history.Nack, name, l, start, st.Nack(ctx, l, 0))
				default:
					if r == 2 {
						start = time.Now()
						record(history.Extend, name, l, start, st.Extend(ctx, l, time.Second))
					}
					start = time.Now()
					record(history.Ack, name, l, start, st.Ack(ctx, l))
				}
			}
		})
	}
	streamStart := time.Now()
	s, err := at.Stream(run, async.StreamConfig{WorkerID: "a", Visibility: time.Second, MaxInFlight: 8})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { // the async consumer
		for l := range s.C() {
			record(history.Claim, "a", l, streamStart, nil)
			start := time.Now()
			if poison(l) {
				err := <-at.Fail(context.Background(), l, errors.New("poison"))
				record(history.Fail, "a", l, start, err)
				if err == nil && l.Attempt >= maxAttempts {
					record(history.Dead, "a", l, start, nil)
					dead.Add(1)
				}
				continue
			}
			record(history.Ack, "a", l, start, <-at.Ack(context.Background(), l))
		}
	})
	wg.Go(func() { // the killer: one of the queue's connections, on a random partition
		for run.Err() == nil {
			time.Sleep(100 * time.Millisecond) // kept: the kill rate is the fault's
			var n int
			err := p.Parts[rand.IntN(len(p.Parts))].QueryRow(context.Background(), `
				SELECT count(pg_terminate_backend(pid))::int FROM (
				  SELECT pid FROM pg_stat_activity WHERE application_name = $1 ORDER BY random() LIMIT 1) AS victim`, app).Scan(&n)
			if err == nil {
				kills.Add(int64(n))
			}
		}
	})

	for wait := time.Now().Add(time.Minute); acks.Load() < total/8; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(wait) {
			t.Fatalf("%d acks in a minute before the restart", acks.Load())
		}
	}
	if err := server.StopKeep(); err != nil {
		t.Fatal(err)
	}
	down.Store(true)
	time.Sleep(2 * time.Second)
	down.Store(false)
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		finished := false // read before the count: the last publish committed before it
		select {
		case <-pubsDone:
			finished = true
		default:
		}
		m, g, err := leftIn(pools) // an error: a partition not back yet
		if err == nil && finished && m == 0 && g == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after the restart: %d of %d published, %d messages and %d groups left (%v)", published.Load(), total, m, g, err)
		}
	}
	stop()
	s.Close()
	wg.Wait()

	var end history.End
	if end.Messages, end.Groups, err = leftIn(pools); err != nil {
		t.Fatal(err)
	}
	for after := int64(0); ; {
		var page []pgtransport.DeadLetter
		err := errors.New("not read")
		for try := 0; err != nil && try < 5; try++ { // an idle connection the killer cut fails once
			page, err = st.DeadLetters(context.Background(), pgtransport.DeadLetterQuery{After: after, Limit: 7})
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, d := range page {
			if d.Seq <= after {
				t.Fatalf("dead letters out of seq order: %d after %d", d.Seq, after)
			}
			end.Dead, after = append(end.Dead, d.Seq), d.Seq
		}
	}
	errs, stats := history.Check(h.Ops(), end)
	for _, err := range errs {
		t.Error(err)
	}
	t.Logf("history: %+v; %d acks while partition 1 was down; batches partly published %d, failed %d; %d connections killed; %d dead letters (%d seen dead by their Fail)",
		stats, acksDown.Load(), partial.Load(), failed.Load(), kills.Load(), len(end.Dead), dead.Load())
	if acksDown.Load() == 0 {
		t.Error("no ack on the other partitions while partition 1 was down")
	}
	if stats.Acked+stats.DeadLettered < total || len(end.Dead) == 0 || kills.Load() == 0 {
		t.Errorf("%d acked and %d dead-lettered of the %d published, %d dead letters, %d kills: the run did not do what it is for",
			stats.Acked, stats.DeadLettered, total, len(end.Dead), kills.Load())
	}
}

// leftIn counts the messages and undrained groups left on every partition. A
// pool's idle connection that a killer or a restart cut fails once, so each
// read is tried three times; an error after that is a partition that is down.
func leftIn(pools []*pgxpool.Pool) (msgs, grps int, err error) {
	for _, pool := range pools {
		var m, g int
		err := errors.New("not read")
		for try := 0; err != nil && try < 3; try++ {
			err = pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM transport_messages), (SELECT count(*) FROM transport_groups WHERE drained_at IS NULL)`).Scan(&m, &g)
		}
		if err != nil {
			return msgs, grps, err
		}
		msgs, grps = msgs+m, grps+g
	}
	return msgs, grps, nil
}
