package contract

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/cluster"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// OpenCluster returns the cluster transport under test on pools (pools[i]
// partition i) with cfg, or its constructor's error; the test owns it.
type OpenCluster func(t *testing.T, pools []*pgxpool.Pool, cfg pgtransport.Config) (Closer, error)

// clusterParts is the partition count the cluster cases run over.
const clusterParts = 4

// clusterEnv is what a cluster case gets: a transport over a fresh queue
// of clusterParts partitions, and the partitions' pools to look at.
type clusterEnv struct {
	env
	p *pgtest.Partitioned
	// openPools opens another transport, on pools, with the case's config.
	openPools func(pools []*pgxpool.Pool) (Closer, error)
	closer    Closer // e.tr
}

// home is group's partition, as a proxy routes it.
func (e *clusterEnv) home(group string) int { return int(cluster.Hashtext(group)) & (clusterParts - 1) }

// countAll adds up a count(*) query over every partition.
func (e *clusterEnv) countAll(query string, args ...any) int {
	e.t.Helper()
	n := 0
	for i := range e.p.Parts {
		n += e.countOn(i, query, args...)
	}
	return n
}

// countOn runs a count(*) query on partition i.
func (e *clusterEnv) countOn(i int, query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.p.Parts[i].QueryRow(e.ctx(), query, args...).Scan(&n); err != nil {
		e.t.Fatalf("partition %d: %s: %v", i, query, err)
	}
	return n
}

// cancelWhenDrained cancels a runtime's ctx once done is closed (every
// message handled) and no message is left on any partition (every ack
// committed), or ctx ends; the function it returns waits for that.
func (e *clusterEnv) cancelWhenDrained(ctx context.Context, cancel context.CancelFunc, done <-chan struct{}) (wait func()) {
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		defer cancel()
		select {
		case <-done:
		case <-ctx.Done():
			return
		}
		for ctx.Err() == nil {
			left := 0
			for _, part := range e.p.Parts {
				var n int
				if err := part.QueryRow(ctx, `SELECT count(*) FROM transport_messages`).Scan(&n); err != nil {
					n = 1 // ask again
				}
				left += n
			}
			if left == 0 {
				return
			}
			time.Sleep(10 * time.Millisecond) // kept: the last acks commit meanwhile
		}
	}()
	return func() { <-stopped }
}

// groupsOn returns a group name for each partition (groupsOn(k)[i] lives
// on partition i), k per partition.
func (e *clusterEnv) groupsOn(k int) [][]string {
	out := make([][]string, clusterParts)
	for n := 0; slices.ContainsFunc(out, func(gs []string) bool { return len(gs) < k }); n++ {
		g := fmt.Sprint("g", n)
		if i := e.home(g); len(out[i]) < k {
			out[i] = append(out[i], g)
		}
	}
	return out
}

// RunCluster runs the cluster cases against transports from open, each
// over a fresh queue of four partitions (pgtest.Partitions: skipped,
// loudly, where the test server has no PL/Proxy). They are the contract's
// cases that hold across partitions, and what partitions add: a group on
// its hashtext partition, claims that find work on any partition, batches
// split and answered in input order, reads merged.
func RunCluster(t *testing.T, open OpenCluster) {
	for _, tc := range clusterCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			p := pgtest.Partitions(t, clusterParts)
			clock := NewClock()
			cfg := pgtransport.Config{Clock: clock.Now, Policy: &pgtransport.Policy{MaxAttempts: 2}}
			e := &clusterEnv{env: env{t: t, clock: clock}, p: p}
			e.openPools = func(pools []*pgxpool.Pool) (Closer, error) { return open(t, pools, cfg) }
			tr, err := e.openPools(p.Parts)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			e.tr, e.closer = tr, tr
			tc.run(is, e)
		})
	}
}

type clusterCase struct {
	name string
	run  func(is *is.I, e *clusterEnv)
}

var clusterCases = []clusterCase{
	{"GroupsLiveOnTheirHomePartition", func(is *is.I, e *clusterEnv) {
		for g := range 40 {
			for m := range 3 {
				e.publish(fmt.Sprint("h", g), fmt.Sprint(m), 0)
			}
		}
		for i := range clusterParts {
			// every message on its group's partition, its seq naming the partition
			is.Equal(e.countOn(i, `SELECT count(*) FROM transport_messages WHERE hashtext(group_id) & 3 <> $1 OR seq & 1023 <> $1`, i), 0)
			is.True(e.countOn(i, `SELECT count(*) FROM transport_messages`) > 0) // 40 groups reach every partition
		}
		is.Equal(e.countAll(`SELECT count(*) FROM transport_messages`), 120)
	}},

	{"FIFOAndOneHolderPerGroup", func(is *is.I, e *clusterEnv) {
		for m := range 5 {
			for g := range 12 {
				e.publish(fmt.Sprint("f", g), event(fmt.Sprint("f", g), m), 0)
			}
		}
		next := map[string]int{}
		parts := map[int]bool{}
		for range 100 {
			a := e.claim("w1", 0)
			if a == nil {
				break
			}
			b := e.claim("w2", 0)
			if b != nil {
				is.True(a.Group != b.Group) // one holder per group, across partitions too
			}
			for _, l := range []*pgtransport.Lease{a, b} {
				if l == nil {
					continue
				}
				is.Equal(l.Event, event(l.Group, next[l.Group])) // each group in publish order
				next[l.Group]++
				parts[int(l.Seq&1023)] = true
				e.ack(l)
			}
		}
		is.Equal(len(next), 12)
		for _, n := range next {
			is.Equal(n, 5) // every message of each group, once
		}
		is.Equal(len(parts), clusterParts)
		is.Equal(e.countAll(`SELECT count(*) FROM transport_groups`), 0)
	}},

	{"ClaimFindsWorkOnAnyPartition", func(is *is.I, e *clusterEnv) {
		// One message on one partition at a time: every claim finds it,
		// wherever the claim's rotation starts.
		for _, gs := range e.groupsOn(2) {
			for _, g := range gs {
				e.publish(g, "only", 0)
				l := e.claim("w", 0)
				is.True(l != nil)
				is.Equal(l.Group, g)
				e.ack(l)
				is.Equal(e.claim("w", 0), nil)
			}
		}
	}},

	{"PriorityFloorAcrossPartitions", func(is *is.I, e *clusterEnv) {
		gs := e.groupsOn(1)
		for i, g := range gs {
			e.publish(g[0], "low", 0)
			if i == 2 {
				e.publish("urgent-"+g[0], "high", 3)
			}
		}
		l := e.claim("w", 3)
		is.True(l != nil)
		is.Equal(l.Event, "high")      // the one group at or above the floor
		is.Equal(e.claim("w", 3), nil) // and no other
		e.ack(l)
		for range clusterParts {
			e.ack(e.claim("w", 0))
		}
		is.Equal(e.claim("w", 0), nil)
	}},

	{"BatchesSplitAndAnswerInInputOrder", func(is *is.I, e *clusterEnv) {
		var msgs []pgtransport.Message
		for m := range 50 {
			g := fmt.Sprint("b", m%10)
			msgs = append(msgs, pgtransport.Message{Group: g, Event: fmt.Sprint(m)})
		}
		seqs, err := e.tr.PublishMany(e.ctx(), msgs)
		is.NoErr(err)
		is.Equal(len(seqs), 50)
		last := map[string]int64{}
		for k, m := range msgs {
			is.Equal(int(seqs[k]&1023), e.home(m.Group)) // seq k is message k's, from its group's partition
			is.True(seqs[k] > last[m.Group])             // rising within a group
			last[m.Group] = seqs[k]
		}
		leases, err := e.tr.ClaimMany(e.ctx(), "w", time.Minute, 0, 10)
		is.NoErr(err)
		is.Equal(len(leases), 10) // filled from several partitions
		for _, l := range leases {
			is.Equal(l.Event, fmt.Sprint(l.Group[1:])) // each group's first message
		}
		stale := *leases[3]
		stale.Token = "w:someone-else"
		errs, err := e.tr.AckMany(e.ctx(), append(slices.Clone(leases), &stale))
		is.NoErr(err)
		is.Equal(len(errs), 11)
		for k, err := range errs {
			if k == 10 {
				is.True(errors.Is(err, pgtransport.ErrLeaseLost)) // the forged lease, in its place
			} else {
				is.NoErr(err)
			}
		}
		is.Equal(e.countAll(`SELECT count(*) FROM transport_messages`), 40)
	}},

	{"BadBatchWritesNothing", func(is *is.I, e *clusterEnv) {
		var msgs []pgtransport.Message
		for m := range 20 {
			msgs = append(msgs, pgtransport.Message{Group: fmt.Sprint("x", m), Event: "ok"})
		}
		msgs[17].Event = "bad\x00"
		_, err := e.tr.PublishMany(e.ctx(), msgs)
		is.True(errors.Is(err, pgtransport.ErrInvalidEvent))
		is.True(strings.Contains(err.Error(), "message 17"))
		_, err = e.tr.AckMany(e.ctx(), []*pgtransport.Lease{{Group: "x1", Seq: 1, Token: "w:t"}, nil})
		is.True(errors.Is(err, pgtransport.ErrNilLease))
		is.Equal(e.countAll(`SELECT count(*) FROM transport_messages`), 0) // no partition wrote
	}},

	{"DeadLettersPageAndRedriveAcrossPartitions", func(is *is.I, e *clusterEnv) {
		for _, gs := range e.groupsOn(2) {
			for _, g := range gs {
				e.publish(g, "poison", 0)
			}
		}
		for range 2 { // MaxAttempts 2: the second Fail dead-letters
			for range 2 * clusterParts {
				l := e.claim("w", 0)
				is.True(l != nil)
				is.NoErr(e.tr.Fail(e.ctx(), l, errors.New("boom")))
			}
			e.clock.Advance(time.Hour) // past the retry backoff
		}
		page1, err := e.tr.DeadLetters(e.ctx(), pgtransport.DeadLetterQuery{Limit: 5})
		is.NoErr(err)
		page2, err := e.tr.DeadLetters(e.ctx(), pgtransport.DeadLetterQuery{After: page1[len(page1)-1].Seq, Limit: 5})
		is.NoErr(err)
		all := append(page1, page2...)
		is.Equal(len(all), 2*clusterParts) // every partition's, paged by seq
		is.True(slices.IsSortedFunc(all, func(a, b pgtransport.DeadLetter) int { return int(a.Seq - b.Seq) }))
		var seqs []int64 // one dead letter of partition 0 and one of partition 3
		for _, want := range []int{0, clusterParts - 1} {
			k := slices.IndexFunc(all, func(d pgtransport.DeadLetter) bool { return e.home(d.Group) == want })
			is.True(k >= 0)
			is.Equal(int(all[k].Seq&1023), want)
			seqs = append(seqs, all[k].Seq)
		}
		n, err := e.tr.Redrive(e.ctx(), pgtransport.DeadLetterFilter{Seqs: seqs})
		is.NoErr(err)
		is.Equal(n, int64(2))
		got := map[int64]bool{}
		for range 2 {
			l := e.claim("w", 0)
			is.True(l != nil)
			got[l.Seq] = true
			e.ack(l)
		}
		is.True(got[seqs[0]] && got[seqs[1]]) // the redriven two, from their partitions
		n, err = e.tr.PurgeDeadLetters(e.ctx(), pgtransport.DeadLetterFilter{})
		is.NoErr(err)
		is.Equal(n, int64(2*clusterParts-2))
		is.Equal(e.countAll(`SELECT count(*) FROM transport_dead_letters`), 0)
	}},

	{"LeaseCallsGoToTheLeasesPartition", func(is *is.I, e *clusterEnv) {
		for _, gs := range e.groupsOn(1) {
			e.publish(gs[0], "1", 0)
			e.publish(gs[0], "2", 0)
		}
		for range clusterParts {
			l := e.claim("w", 0)
			is.True(l != nil)
			is.NoErr(e.tr.Extend(e.ctx(), l, time.Hour))
			forged := *l
			forged.Seq = l.Seq + 1 // the same lease, as if of the next partition
			is.True(errors.Is(e.tr.Ack(e.ctx(), &forged), pgtransport.ErrLeaseLost))
			next, err := e.tr.AckNext(e.ctx(), l, time.Minute)
			is.NoErr(err)
			is.Equal(next.Event, "2") // the group kept, on its partition
			is.NoErr(e.tr.Nack(e.ctx(), next, 0))
		}
		for range clusterParts {
			e.ack(e.claim("w", 0))
		}
		is.Equal(e.countAll(`SELECT count(*) FROM transport_messages`), 0)
	}},

	{"PublishTxOnlyOnTheGroupsPartition", func(is *is.I, e *clusterEnv) {
		g := "tx-group"
		home := e.home(g)
		other := (home + 1) % clusterParts
		tx, err := e.p.Parts[other].Begin(e.ctx())
		is.NoErr(err)
		_, err = e.tr.PublishMessageTx(e.ctx(), tx, pgtransport.Message{Group: g, Event: "e"})
		is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // another partition's transaction
		is.NoErr(tx.Commit(e.ctx()))
		is.Equal(e.countAll(`SELECT count(*) FROM transport_messages`), 0)
		// A database that holds no queue (the proxy's, here) is refused
		// alike, and the caller's transaction lives on.
		tx, err = e.p.Proxy.Begin(e.ctx())
		is.NoErr(err)
		_, err = e.tr.PublishMessageTx(e.ctx(), tx, pgtransport.Message{Group: g, Event: "e"})
		is.True(errors.Is(err, pgtransport.ErrInvalidConfig))
		_, err = tx.Exec(e.ctx(), `SELECT 1`)
		is.NoErr(err) // not aborted
		_, err = e.tr.PublishMessageTx(e.ctx(), tx, pgtransport.Message{Group: "", Event: "e"})
		is.True(errors.Is(err, pgtransport.ErrInvalidGroup)) // bad input first, as on one database
		is.True(errors.Is(e.tr.(Exactly).AckTx(e.ctx(), tx, nil), pgtransport.ErrNilLease))
		is.NoErr(tx.Rollback(e.ctx()))
		tx, err = e.p.Parts[home].Begin(e.ctx())
		is.NoErr(err)
		_, err = e.tr.PublishMessageTx(e.ctx(), tx, pgtransport.Message{Group: g, Event: "e"})
		is.NoErr(err)
		is.Equal(e.claim("w", 0), nil) // invisible until the commit
		is.NoErr(tx.Commit(e.ctx()))
		l := e.claim("w", 0)
		is.True(l != nil)
		is.Equal(l.Group, g)
		e.ack(l)
	}},

	{"ClaimWaitWakesForAnyPartition", func(is *is.I, e *clusterEnv) {
		for _, gs := range e.groupsOn(1) {
			ctx, cancel := context.WithTimeout(e.ctx(), 30*time.Second)
			got := make(chan *pgtransport.Lease, 1)
			go func() {
				l, err := e.tr.ClaimWait(ctx, "w", time.Minute, 0)
				if err != nil {
					e.t.Errorf("claim wait: %v", err)
				}
				got <- l
			}()
			time.Sleep(50 * time.Millisecond) // kept: the wait is under way before the publish
			e.publish(gs[0], "late", 0)
			l := <-got
			cancel()
			is.True(l != nil)
			is.Equal(l.Group, gs[0])
			e.ack(l)
		}
		is.Equal(e.countAll(`SELECT count(*) FROM transport_groups`), 0)
	}},

	{"EveryCallAfterCloseIsErrClosed", func(is *is.I, e *clusterEnv) {
		// g's lease held, h's transaction on h's partition: as on one database.
		afterClose(e.t, e.closer, e.p.Parts[e.home("h")].Begin, func(query string, args ...any) int { return e.countAll(query, args...) })
	}},

	{"OperatorReadsAddUpOverPartitions", func(is *is.I, e *clusterEnv) {
		op := e.tr.(Operator)
		var names []string
		for _, gs := range e.groupsOn(3) {
			for k, g := range gs {
				names = append(names, g)
				for range k + 1 {
					e.publish(g, "m", k)
				}
			}
		}
		st, err := op.Stats(e.ctx())
		is.NoErr(err)
		is.Equal(st.Total.Groups, int64(3*clusterParts)) // every partition's groups
		is.Equal(st.Total.Messages, int64(6*clusterParts))
		is.Equal(st.ByPriority[2].Groups, int64(clusterParts))
		slices.Sort(names)
		page, err := op.Groups(e.ctx(), pgtransport.GroupQuery{Offset: 2, Limit: 5})
		is.NoErr(err)
		is.Equal(len(page), 5)
		for k, g := range page {
			is.Equal(g.Group, names[2+k]) // one order over every partition, paged
		}
		is.NoErr(op.PauseGroup(e.ctx(), names[0]))
		info, err := op.Group(e.ctx(), names[0])
		is.NoErr(err)
		is.Equal(info.State, pgtransport.GroupPaused)
		peek, err := op.Peek(e.ctx(), names[0], 10)
		is.NoErr(err)
		is.True(len(peek) > 0)
		n, err := op.PurgeGroup(e.ctx(), names[0], 0)
		is.NoErr(err)
		is.Equal(n, int64(len(peek)))
	}},

	{"WorkServesEveryPartitionInOrder", func(is *is.I, e *clusterEnv) {
		w := e.tr.(Operator)
		const groups, per = 24, 6
		for m := range per {
			for g := range groups {
				e.publish(fmt.Sprint("w", g), fmt.Sprint(m), 0)
			}
		}
		var (
			mu      stdsync.Mutex
			next    = map[string]int{}
			holding = map[string]bool{}
			parts   = map[int]int{}
			bad     []string
			done    = make(chan struct{})
		)
		ctx, cancel := context.WithCancel(e.ctx())
		defer e.cancelWhenDrained(ctx, cancel, done)()
		defer cancel() // first: the wait above ends with it
		err := w.Work(ctx, pgtransport.WorkerConfig{Concurrency: 6, Visibility: time.Minute}, func(ctx context.Context, l *pgtransport.Lease) error {
			mu.Lock()
			if holding[l.Group] {
				bad = append(bad, "two holders of "+l.Group)
			}
			if l.Event != fmt.Sprint(next[l.Group]) {
				bad = append(bad, fmt.Sprintf("%s: %s handed out, %d next", l.Group, l.Event, next[l.Group]))
			}
			holding[l.Group] = true
			next[l.Group]++
			if parts[int(l.Seq&1023)]++; sum(parts) == groups*per { // once: the count only grows
				close(done)
			}
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			holding[l.Group] = false
			mu.Unlock()
			return nil
		})
		is.NoErr(err)
		is.Equal(bad, nil)
		is.Equal(len(parts), clusterParts) // a runtime on every partition
		is.Equal(sum(parts), groups*per)
		is.Equal(e.countAll(`SELECT count(*) FROM transport_messages`), 0)
	}},

	{"WorkTxKeepsStateOnTheGroupsPartition", func(is *is.I, e *clusterEnv) {
		x := e.tr.(Exactly)
		gs := e.groupsOn(1)
		for m := range 3 {
			for _, g := range gs {
				e.publish(g[0], fmt.Sprint(m), 0)
			}
		}
		var (
			handled atomicCount
			mu      stdsync.Mutex
			bad     []string
		)
		ctx, cancel := context.WithCancel(e.ctx())
		done := make(chan struct{})
		defer e.cancelWhenDrained(ctx, cancel, done)()
		defer cancel() // first: the wait above ends with it
		err := x.WorkTx(ctx, pgtransport.WorkerConfig{Concurrency: 4, Visibility: time.Minute}, func(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease, state []byte) ([]byte, error) {
			var part int
			if err := tx.QueryRow(ctx, `SELECT part FROM transport_partition`).Scan(&part); err != nil {
				return nil, err
			}
			mu.Lock()
			if part != e.home(l.Group) {
				bad = append(bad, fmt.Sprintf("%s handled in partition %d's transaction, lives on %d", l.Group, part, e.home(l.Group)))
			}
			if want := "012"[:l.Event[0]-'0']; string(state) != want { // "0" saw "", "1" saw "0", "2" saw "01"
				bad = append(bad, fmt.Sprintf("%s message %s: state %q, want %q", l.Group, l.Event, state, want))
			}
			mu.Unlock()
			if handled.add() == 3*clusterParts {
				close(done)
			}
			return append(state, l.Event...), nil
		})
		is.NoErr(err)
		is.Equal(bad, nil) // each message's state the one its predecessors saved, in its partition's transaction
		is.Equal(e.countAll(`SELECT count(*) FROM transport_messages`), 0)
	}},

	{"CloseEndsAClaimWaitWithErrClosed", func(is *is.I, e *clusterEnv) {
		ctx, cancel := context.WithTimeout(e.ctx(), 30*time.Second)
		defer cancel()
		got := make(chan error, 1)
		go func() {
			_, err := e.tr.ClaimWait(ctx, "w", time.Minute, 0)
			got <- err
		}()
		time.Sleep(100 * time.Millisecond) // kept: the wait is under way on every partition
		e.closer.Close()
		is.True(errors.Is(<-got, pgtransport.ErrClosed)) // not ctx's error: Close ended it
	}},

	{"RefusesAMisnumberedCluster", func(is *is.I, e *clusterEnv) {
		swapped := slices.Clone(e.p.Parts)
		swapped[0], swapped[1] = swapped[1], swapped[0]
		_, err := e.openPools(swapped)
		is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // pools out of place
		_, err = e.openPools(e.p.Parts[:3])
		is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // not a power of two
	}},
}

func sum(m map[int]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// atomicCount counts across goroutines.
type atomicCount struct{ n atomic.Int64 }

func (c *atomicCount) add() int { return int(c.n.Add(1)) }

// RunOpenCluster checks opening a cluster from its proxy's map (open is
// the front-end's OpenCluster): the partitions found, the queue usable,
// and a database that is no proxy refused.
func RunOpenCluster(t *testing.T, open func(ctx context.Context, proxyDSN string, cfg pgtransport.Config) (Closer, error)) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Partitions(t, clusterParts)
	ctx := pgtest.Context(t)
	tr, err := open(ctx, p.ProxyDSN, pgtransport.Config{Schema: p.Schema, SkipApply: true})
	is.NoErr(err)
	defer tr.Close()
	for g := range 20 {
		_, err := tr.Publish(ctx, fmt.Sprint("o", g), "e", 0)
		is.NoErr(err)
	}
	for _, part := range p.Parts {
		var n int
		is.NoErr(part.QueryRow(ctx, `SELECT count(*) FROM transport_messages`).Scan(&n))
		is.True(n > 0) // every partition the map lists got its groups
	}
	for range 20 {
		l, err := tr.Claim(ctx, "w", time.Minute, 0)
		is.NoErr(err)
		is.NoErr(tr.Ack(ctx, l))
	}
	db := pgtest.New(t, 2)
	_, err = open(ctx, pgtest.DSN(t), pgtransport.Config{Schema: db.Schema, SkipApply: true})
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // no proxy there
}
