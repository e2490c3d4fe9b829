package history_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matryer/is"
	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/cluster"
	"github.com/pgtransport/pgtransport/internal/testkit/history"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// TestClusterGrows: a queue over two partitions grows to four while it is
// worked, as docs/protocol.md ("Growing the cluster") says: new partitions
// numbered 2 and 3, then schema.Grow through the proxy. A Cluster opened
// before goes on publishing and working with the old map throughout: its
// publishes of a moving group that has left its old partition are refused
// (ErrGroupMoved), nothing written. A Cluster opened after (and an async
// Cluster on it) publishes through the old homes first and works all four.
// The history holds the transport's guarantees across the growth
// (history.Check: every message acked exactly once, first deliveries of a
// group in publish order, no two overlapping leases of a group that both
// settled), moving groups were seen both draining in place and moved, and
// once drained schema.Grown ends the growth.
func TestClusterGrows(t *testing.T) {
	t.Parallel()
	p := pgtest.Growable(t, 2)
	ctx := context.Background()
	// A dedup key keeps its group in place for its window: a short one, so
	// that groups published with keys move too.
	const window = 300 * time.Millisecond
	cfg := pgtransport.Config{SkipApply: true, IdleSweep: 200 * time.Millisecond, DedupWindow: window, Logger: slog.New(slog.DiscardHandler)}
	old, err := pgsync.NewCluster(ctx, p.Parts, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(old.Close)

	var (
		h                    history.History
		cur                  atomic.Pointer[pgsync.Transport]
		grown                atomic.Bool
		published, acks      atomic.Int64
		refused, inPlace, to atomic.Int64
	)
	cur.Store(old)
	const groups, total = 30, 2500
	moves := func(g string) bool { return cluster.Hashtext(g)&1 != cluster.Hashtext(g)&3 }
	record := func(kind history.Kind, worker string, l *pgtransport.Lease, start time.Time, err error) {
		h.Add(history.Op{Kind: kind, Worker: worker, Group: l.Group, Seq: l.Seq, Token: l.Token, Outcome: outcome(err), Start: start, End: time.Now()})
		if kind == history.Ack && err == nil {
			acks.Add(1)
		}
	}
	run, stop := context.WithCancel(ctx)
	defer stop()
	var wg stdsync.WaitGroup
	publisher := func(name string, current func() *pgsync.Transport) {
		for n := 0; published.Load() < total && run.Err() == nil; n++ {
			var msgs []pgtransport.Message
			for k := range 5 {
				m := pgtransport.Message{Group: fmt.Sprint("g", rand.IntN(groups)), Event: fmt.Sprintf("%s-%d-%d", name, n, k)}
				if k%2 == 1 {
					m.DedupKey = m.Event // the keyed publish, fenced too
				}
				msgs = append(msgs, m)
			}
			cl := current()
			after := grown.Load() && cl != old
			start := time.Now()
			seqs, err := cl.PublishMany(ctx, msgs)
			switch {
			case errors.Is(err, pgtransport.ErrGroupMoved) && cl == old:
				refused.Add(1)
			case err != nil:
				t.Errorf("%s: publish: %v", name, err)
			}
			for k, m := range msgs {
				op := history.Op{Kind: history.Publish, Worker: name, Group: m.Group, Outcome: history.Failed, Start: start, End: time.Now()}
				if k < len(seqs) && seqs[k] != 0 {
					op.Seq, op.Outcome = seqs[k], history.OK
					published.Add(1)
					if after && moves(m.Group) {
						if int(seqs[k]&3) == int(cluster.Hashtext(m.Group)&3) {
							to.Add(1)
						} else {
							inPlace.Add(1)
						}
					}
				}
				h.Add(op)
			}
			// Kept: the publishers' pace, so publishing spans the growth,
			// and a short backlog, so groups drain and move.
			time.Sleep(10 * time.Millisecond)
			for published.Load()-acks.Load() > 80 && run.Err() == nil {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	// The publishers end once total are published; a batch in flight then
	// still commits, so the drain below waits for them all to return
	// first (else it may stop the workers before that batch's commit).
	var pubs stdsync.WaitGroup
	pubs.Go(func() { publisher("pub0", cur.Load) })
	pubs.Go(func() { publisher("pub1", cur.Load) })
	pubs.Go(func() { publisher("stale", func() *pgsync.Transport { return old }) }) // the old map, throughout
	pubsDone := make(chan struct{})
	go func() { pubs.Wait(); close(pubsDone) }()
	worker := func(name string, cl *pgsync.Transport) {
		for run.Err() == nil {
			start := time.Now()
			l, err := cl.ClaimWait(run, name, 2*time.Second, 0)
			if err != nil {
				continue
			}
			record(history.Claim, name, l, start, nil)
			start = time.Now()
			record(history.Ack, name, l, start, cl.Ack(ctx, l))
		}
	}
	for w := range 2 {
		wg.Go(func() { worker(fmt.Sprint("old", w), old) })
	}

	for wait := time.Now().Add(time.Minute); acks.Load() < total/5; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(wait) {
			t.Fatalf("%d acks in a minute before the growth", acks.Load())
		}
	}
	// A moving group paused across the growth keeps its row in its old
	// home, so its messages published meanwhile drain there once it is
	// resumed (through the grown Cluster, which locates it).
	paused := "g0"
	for i := 0; !moves(paused); i++ {
		paused = fmt.Sprint("g", i)
	}
	start := time.Now()
	seq, err := old.Publish(ctx, paused, "before the pause", 0)
	if err != nil {
		t.Fatal(err)
	}
	h.Add(history.Op{Kind: history.Publish, Worker: "pause", Group: paused, Seq: seq, Outcome: history.OK, Start: start, End: time.Now()})
	published.Add(1)
	if err := old.PauseGroup(ctx, paused); err != nil {
		t.Fatal(err)
	}
	growStart, pubBefore := time.Now(), published.Load()
	n, err := p.Grow(ctx)
	if err != nil || n != 4 {
		t.Fatalf("grow: %d, %v", n, err)
	}
	t.Logf("grown in %v, %d published before, %d after", time.Since(growStart).Round(time.Millisecond), pubBefore, published.Load())
	if _, err := pgsync.NewCluster(ctx, p.Parts[:2], cfg); !errors.Is(err, pgtransport.ErrInvalidConfig) {
		t.Fatalf("the old partitions alone opened as a cluster: %v", err) // half a grown cluster would misroute
	}
	grownCl, err := pgsync.NewCluster(ctx, p.Parts, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(grownCl.Close)
	if grownCl.Partitions() != 4 {
		t.Fatalf("the grown cluster has %d partitions", grownCl.Partitions())
	}
	for _, bad := range []string{"", "g\x00moving"} { // refused before anything is sent
		if _, err := grownCl.Locate(ctx, bad); !errors.Is(err, pgtransport.ErrInvalidGroup) {
			t.Errorf("Locate(%q): %v", bad, err)
		}
		if _, err := grownCl.State(ctx, bad); !errors.Is(err, pgtransport.ErrInvalidGroup) {
			t.Errorf("State(%q): %v", bad, err)
		}
	}
	at, err := async.NewCluster(ctx, p.Parts, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(at.Close)
	grown.Store(true)
	cur.Store(grownCl)
	for w := range 2 {
		wg.Go(func() { worker(fmt.Sprint("new", w), grownCl) })
	}
	streamStart := time.Now()
	s, err := at.Stream(run, async.StreamConfig{WorkerID: "a", Visibility: 2 * time.Second, MaxInFlight: 4})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		for l := range s.C() {
			record(history.Claim, "a", l, streamStart, nil)
			start := time.Now()
			record(history.Ack, "a", l, start, <-at.Ack(ctx, l))
		}
	})

	time.Sleep(time.Second) // kept: publishes of the paused group pile up in its old home
	if i, err := grownCl.Locate(ctx, paused); err != nil || i != int(cluster.Hashtext(paused)&1) {
		t.Fatalf("the paused group located in %d (%v), not its old home", i, err)
	}
	if err := grownCl.ResumeGroup(ctx, paused); err != nil {
		t.Fatal(err)
	}

	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		finished := false // read before the count: the last publish committed before it
		select {
		case <-pubsDone:
			finished = true
		default:
		}
		m, g, err := leftIn(p.Parts)
		if err != nil {
			t.Fatal(err)
		}
		if finished && m == 0 && g == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after the growth: %d of %d published, %d messages and %d groups left", published.Load(), total, m, g)
		}
	}
	stop()
	s.Close()
	wg.Wait()
	var end history.End
	if end.Messages, end.Groups, err = leftIn(p.Parts); err != nil {
		t.Fatal(err)
	}

	// A PublishTx of a moving group that has left: in its old partition's
	// transaction the fence refuses it; in its new one's it is published.
	moved := "moved0"
	for i := 0; !moves(moved); i++ {
		moved = fmt.Sprint("moved", i)
	}
	for _, i := range []int{int(cluster.Hashtext(moved) & 1), int(cluster.Hashtext(moved) & 3)} {
		tx, err := p.Parts[i].Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = grownCl.PublishTx(ctx, tx, moved, "in a tx", 0)
		if old := i < 2; old && !errors.Is(err, pgtransport.ErrGroupMoved) || !old && err != nil {
			t.Errorf("PublishTx of %s in partition %d's transaction: %v", moved, i, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}

	errs, stats := history.Check(h.Ops(), end)
	for _, err := range errs {
		t.Error(err)
	}
	t.Logf("history: %+v; after the growth, moving groups' messages: %d drained in place, %d in their new home; %d stale batches refused",
		stats, inPlace.Load(), to.Load(), refused.Load())
	if inPlace.Load() == 0 || to.Load() == 0 || refused.Load() == 0 {
		t.Error("the run did not exercise the growth: a moving group must be seen in place, moved, and refused to the old map")
	}
	time.Sleep(2 * window) // kept: the last keys expire
	if n, err := schema.Grown(ctx, p.Proxy, p.Schema); err != nil || n != 4 {
		t.Fatalf("grown: %d, %v", n, err)
	}
	again, err := pgsync.NewCluster(ctx, p.Parts, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	seq, err = again.Publish(ctx, paused, "after", 0)
	if err != nil || int(seq&3) != int(cluster.Hashtext(paused)&3) {
		t.Fatalf("after the growth ended, %s was published as %d (%v), not in its home %d", paused, seq, err, cluster.Hashtext(paused)&3)
	}
}

// TestGrowDeadLettersByGroup: while the cluster grows, a moving group's
// dead letters stay in its old partition (they keep it there), and the
// calls that name the group find them: DeadLetters lists them, Redrive
// puts them back (drained in place), PurgeDeadLetters deletes them.
func TestGrowDeadLettersByGroup(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Growable(t, 2)
	ctx := pgtest.Context(t)
	cfg := pgtransport.Config{SkipApply: true, Policy: &pgtransport.Policy{MaxAttempts: 1}, Logger: slog.New(slog.DiscardHandler)}
	old, err := pgsync.NewCluster(ctx, p.Parts, cfg)
	is.NoErr(err)
	defer old.Close()
	var moving []string
	for i := 0; len(moving) < 2; i++ {
		if g := fmt.Sprintf("dl-%d", i); cluster.Hashtext(g)&1 != cluster.Hashtext(g)&3 {
			moving = append(moving, g)
		}
	}
	for _, g := range moving { // each gets a dead letter in its old home
		_, err := old.Publish(ctx, g, "poison", 0)
		is.NoErr(err)
		l, err := old.Claim(ctx, "w", time.Minute, 0)
		is.NoErr(err)
		is.NoErr(old.Fail(ctx, l, errors.New("dead")))
	}
	n, err := p.Grow(ctx)
	is.NoErr(err)
	is.Equal(n, 4)
	grown, err := pgsync.NewCluster(ctx, p.Parts, cfg)
	is.NoErr(err)
	defer grown.Close()
	for _, g := range moving {
		ds, err := grown.DeadLetters(ctx, pgtransport.DeadLetterQuery{Group: g})
		is.NoErr(err)
		is.Equal(len(ds), 1) // found in the old home, where it kept its group
	}
	redriven, err := grown.Redrive(ctx, pgtransport.DeadLetterFilter{Group: moving[0]})
	is.NoErr(err)
	is.Equal(redriven, int64(1)) // put back, in place
	l, err := grown.Claim(ctx, "w", time.Minute, 0)
	is.NoErr(err)
	is.Equal(l.Group, moving[0])
	is.NoErr(grown.Ack(ctx, l))
	purged, err := grown.PurgeDeadLetters(ctx, pgtransport.DeadLetterFilter{Group: moving[1]})
	is.NoErr(err)
	is.Equal(purged, int64(1)) // deleted where it was
}
