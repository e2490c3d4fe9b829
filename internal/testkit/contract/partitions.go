package contract

import (
	"context"
	"errors"
	"fmt"
	"slices"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// acrossPartitionsCases: what only a queue of several partitions has,
// run on the partitioned topology alone: a group on its home partition,
// claims that find work on any partition and pass over one that fails,
// batches split and answered in input order, reads merged, calls in the
// caller's transaction placed on the group's partition, and a cluster
// whose pools are out of place refused.
var acrossPartitionsCases = []testCase{
	{"GroupsLiveOnTheirHomePartition", groupsLiveOnTheirHomePartition},
	{"ClaimFindsWorkOnAnyPartition", claimFindsWorkOnAnyPartition},
	{"ClaimPassesOverALostReply", claimPassesOverALostReply},
	{"BatchesSplitAndAnswerInInputOrder", batchesSplitAndAnswerInInputOrder},
	{"DeadLettersPageAndRedriveAcrossPartitions", deadLettersPageAndRedriveAcrossPartitions},
	{"LeaseCallsGoToTheLeasesPartition", leaseCallsGoToTheLeasesPartition},
	{"PublishTxOnlyOnTheGroupsPartition", publishTxOnlyOnTheGroupsPartition},
	{"ClaimWaitWakesForAnyPartition", claimWaitWakesForAnyPartition},
	{"OperatorReadsAddUpOverPartitions", operatorReadsAddUpOverPartitions},
	{"WorkServesEveryPartitionInOrder", workServesEveryPartitionInOrder},
	{"WorkTxKeepsStateOnTheGroupsPartition", workTxKeepsStateOnTheGroupsPartition},
	{"RefusesAMisnumberedCluster", refusesAMisnumberedCluster},
}

// groupsLiveOnTheirHomePartition: every message is stored on its group's
// home partition (hashtext, as the proxy routes), its seq naming that
// partition.
func groupsLiveOnTheirHomePartition(is *is.I, e *env) {
	for g := range 40 {
		for m := range 3 {
			e.publish(fmt.Sprint("h", g), fmt.Sprint(m), 0)
		}
	}
	for i := range e.n {
		// every message on its group's partition, its seq naming the partition
		is.Equal(e.countOn(i, `SELECT count(*) FROM transport_messages WHERE hashtext(group_id) & $2 <> $1 OR seq & 1023 <> $1`, i, e.n-1), 0)
		is.True(e.countOn(i, `SELECT count(*) FROM transport_messages`) > 0) // 40 groups reach every partition
	}
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 120)
}

// claimFindsWorkOnAnyPartition: with one message on one partition at a
// time, every claim finds it, wherever the claim's rotation starts.
func claimFindsWorkOnAnyPartition(is *is.I, e *env) {
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
}

// claimPassesOverALostReply: a claim whose reply one partition loses
// (after that partition leased) goes on to the next partitions, and
// returns one of their leases; the lost lease's group comes back once its
// visibility ends. Each claim starts its rotation one partition further,
// so one of the first n starts at the lossy partition; the others have
// two groups each, more than those claims can take.
func claimPassesOverALostReply(is *is.I, e *env) {
	lost := e.place("lost", 0)
	e.publish(lost, "l", 0)
	for k := 1; k < e.n; k++ {
		for j := range 2 {
			e.publish(e.place(fmt.Sprint("found", j), k), "f", 0)
		}
	}
	lp := e.lossy()
	lp.cut(lost, "claimer")
	var found []*pgtransport.Lease
	for range e.n {
		l, err := lp.tr.Claim(e.ctx(), "claimer", time.Minute, 0)
		is.NoErr(err)     // the lost reply is passed over
		is.True(l != nil) // for another partition's lease
		is.True(l.Group != lost)
		found = append(found, l)
		if lp.lost() == 1 {
			break
		}
	}
	is.Equal(lp.lost(), 1)                                                                                                 // a claim reached the lossy partition
	is.Equal(e.count(`SELECT count(*) FROM transport_groups WHERE group_id = $1 AND locked_by LIKE 'claimer:%'`, lost), 1) // which leased, unknown to the caller
	for _, l := range found {
		e.ack(l)
	}
	e.clock.Advance(2 * time.Minute)
	l := e.claim("w", 0)
	for l != nil && l.Group != lost {
		e.ack(l)
		l = e.claim("w", 0)
	}
	is.True(l != nil) // the lost lease's group, back after its visibility
	e.ack(l)
}

// batchesSplitAndAnswerInInputOrder: a batch is split by partition and
// answered in input order: each seq from its group's partition, the leases
// of a batch claim from several partitions, an AckMany's errors each in
// its lease's place.
func batchesSplitAndAnswerInInputOrder(is *is.I, e *env) {
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
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 40)
}

// deadLettersPageAndRedriveAcrossPartitions: dead letters page by seq over
// every partition, and a redrive by seqs of two partitions and a purge of
// all act on each.
func deadLettersPageAndRedriveAcrossPartitions(is *is.I, e *env) {
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 2}})
	for _, gs := range e.groupsOn(2) {
		for _, g := range gs {
			e.publish(g, "poison", 0)
		}
	}
	for range 2 { // MaxAttempts 2: the second Fail dead-letters
		for range 2 * e.n {
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
	is.Equal(len(all), 2*e.n) // every partition's, paged by seq
	is.True(slices.IsSortedFunc(all, func(a, b pgtransport.DeadLetter) int { return int(a.Seq - b.Seq) }))
	var seqs []int64 // one dead letter of the first partition and one of the last
	for _, want := range []int{0, e.n - 1} {
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
	is.Equal(n, int64(2*e.n-2))
	is.Equal(e.count(`SELECT count(*) FROM transport_dead_letters`), 0)
}

// leaseCallsGoToTheLeasesPartition: the settling calls go to the partition
// the lease's seq names: a lease whose seq names another partition is not
// found there.
func leaseCallsGoToTheLeasesPartition(is *is.I, e *env) {
	for _, gs := range e.groupsOn(1) {
		e.publish(gs[0], "1", 0)
		e.publish(gs[0], "2", 0)
	}
	for range e.n {
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
	for range e.n {
		e.ack(e.claim("w", 0))
	}
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 0)
}

// publishTxOnlyOnTheGroupsPartition: a publish in the caller's transaction
// is taken only on the group's partition: another partition's transaction,
// or one on a database that holds no queue, is refused before anything is
// written (and bad input first, as on one database).
func publishTxOnlyOnTheGroupsPartition(is *is.I, e *env) {
	g := "tx-group"
	home := e.home(g)
	other := (home + 1) % e.n
	tx, err := e.pools[other].Begin(e.ctx())
	is.NoErr(err)
	_, err = e.tr.PublishMessageTx(e.ctx(), tx, pgtransport.Message{Group: g, Event: "e"})
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // another partition's transaction
	is.NoErr(tx.Commit(e.ctx()))
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 0)
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
	tx, err = e.pools[home].Begin(e.ctx())
	is.NoErr(err)
	_, err = e.tr.PublishMessageTx(e.ctx(), tx, pgtransport.Message{Group: g, Event: "e"})
	is.NoErr(err)
	is.Equal(e.claim("w", 0), nil) // invisible until the commit
	is.NoErr(tx.Commit(e.ctx()))
	l := e.claim("w", 0)
	is.True(l != nil)
	is.Equal(l.Group, g)
	e.ack(l)
}

// claimWaitWakesForAnyPartition: a ClaimWait parked on every partition
// wakes for a publish on any of them.
func claimWaitWakesForAnyPartition(is *is.I, e *env) {
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
		e.waitParked()
		e.publish(gs[0], "late", 0)
		l := <-got
		cancel()
		is.True(l != nil)
		is.Equal(l.Group, gs[0])
		e.ack(l)
	}
	is.Equal(e.count(`SELECT count(*) FROM transport_groups WHERE drained_at IS NULL`), 0)
}

// operatorReadsAddUpOverPartitions: Stats adds up every partition's
// counts, Groups pages over every partition in one order, and the calls on
// one group go to its partition.
func operatorReadsAddUpOverPartitions(is *is.I, e *env) {
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
	is.Equal(st.Total.Groups, int64(3*e.n)) // every partition's groups
	is.Equal(st.Total.Messages, int64(6*e.n))
	is.Equal(st.ByPriority[2].Groups, int64(e.n))
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
}

// workServesEveryPartitionInOrder: Work runs a runtime on every partition:
// every message handled once, each group in order, one holder at a time.
func workServesEveryPartitionInOrder(is *is.I, e *env) {
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
	is.Equal(len(parts), e.n) // a runtime on every partition
	is.Equal(sum(parts), groups*per)
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 0)
}

// workTxKeepsStateOnTheGroupsPartition: WorkTx runs each handler in a
// transaction on its group's partition, its state the one its predecessors
// saved there.
func workTxKeepsStateOnTheGroupsPartition(is *is.I, e *env) {
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
		if handled.add() == 3*e.n {
			close(done)
		}
		return append(state, l.Event...), nil
	})
	is.NoErr(err)
	is.Equal(bad, nil) // each message's state the one its predecessors saved, in its partition's transaction
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 0)
}

// refusesAMisnumberedCluster: pools out of place, or a count that is not a
// power of two, are refused on open (ErrInvalidConfig).
func refusesAMisnumberedCluster(is *is.I, e *env) {
	swapped := slices.Clone(e.pools)
	swapped[0], swapped[1] = swapped[1], swapped[0]
	_, err := e.openOn(swapped, e.config())
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // pools out of place
	_, err = e.openOn(e.pools[:3], e.config())
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // not a power of two
}

// countOn runs a count(*) query on partition i.
func (e *env) countOn(i int, query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pools[i].QueryRow(e.ctx(), query, args...).Scan(&n); err != nil {
		e.t.Fatalf("partition %d: %s: %v", i, query, err)
	}
	return n
}

// groupsOn returns group names by partition (groupsOn(k)[i] live on
// partition i), k per partition.
func (e *env) groupsOn(k int) [][]string {
	out := make([][]string, e.n)
	for n := 0; slices.ContainsFunc(out, func(gs []string) bool { return len(gs) < k }); n++ {
		g := fmt.Sprint("g", n)
		if i := e.home(g); len(out[i]) < k {
			out[i] = append(out[i], g)
		}
	}
	return out
}

// cancelWhenDrained cancels a runtime's ctx once done is closed (every
// message handled) and no message is left on any partition (every ack
// committed), or ctx ends; the function it returns waits for that.
func (e *env) cancelWhenDrained(ctx context.Context, cancel context.CancelFunc, done <-chan struct{}) (wait func()) {
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
			for _, part := range e.pools {
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

// RunOpenCluster checks opening a transport over partitions from its
// proxy's map (open is the front-end's OpenCluster): the partitions found,
// the queue usable, and a database that is no proxy refused.
func RunOpenCluster(t *testing.T, open func(ctx context.Context, proxyDSN string, cfg pgtransport.Config) (Transport, error)) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.ReusedPartitions(t, partitions)
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
