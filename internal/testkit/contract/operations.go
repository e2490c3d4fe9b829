package contract

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	stdsync "sync"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// operationsCases: what an operator sees (Stats, Groups, Group, Peek) and
// steers (pause, resume, purge).
var operationsCases = []testCase{
	{"GroupsByStateOrderAndPage", groupsByStateOrderAndPage},
	{"PeekDoesNotLease", peekDoesNotLease},
	{"PauseStopsEveryClaim", pauseStopsEveryClaim},
	{"PausedGroupKeepsItsRowWhenDrained", pausedGroupKeepsItsRowWhenDrained},
	{"PurgeFencesTheHolder", purgeFencesTheHolder},
	{"RefusalsWriteNothing", refusalsWriteNothing},
}

func (e *env) op() Operator {
	e.t.Helper()
	o, ok := e.tr.(Operator)
	if !ok {
		e.t.Fatalf("%T lacks the operator's calls (contract.Operator)", e.tr)
	}
	return o
}

func (e *env) group(g string) pgtransport.GroupInfo {
	e.t.Helper()
	info, err := e.op().Group(e.ctx(), g)
	if err != nil {
		e.t.Fatalf("group %s: %v", g, err)
	}
	return info
}

func (e *env) groups(q pgtransport.GroupQuery) []string {
	e.t.Helper()
	gs, err := e.op().Groups(e.ctx(), q)
	if err != nil {
		e.t.Fatalf("groups %+v: %v", q, err)
	}
	var ids []string
	for _, g := range gs {
		ids = append(ids, g.Group)
	}
	return ids
}

func (e *env) claimFor(vis time.Duration, minPriority int, want string) *pgtransport.Lease {
	e.t.Helper()
	l, err := e.tr.Claim(e.ctx(), "w", vis, minPriority)
	if err != nil || l == nil || l.Group != want {
		e.t.Fatalf("claim: got %+v, %v; want a lease of %s", l, err, want)
	}
	return l
}

// groupsByStateOrderAndPage builds one group in each state, with heads
// published in an order unlike the ids', and checks every filter, every
// order, paging, Group's fields and Stats' counts. Its groups share a
// partition: OldestHead compares the heads' ages as each partition reads
// them, exact within one partition, but across two only to the instants
// their reads differ by, more than some of these publishes are apart
// (AcrossPartitions/OperatorReadsAddUpOverPartitions merges partitions).
func groupsByStateOrderAndPage(is *is.I, e *env) {
	op := e.op()
	G, Gs := func(g string) string { return e.place(g, 0) }, e.local
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{RetryBackoffMin: time.Hour, RetryBackoffMax: time.Hour}})
	t0 := e.clock.Now()

	// z: parked after two attempts (a lapsed lease, then a Fail).
	e.publish(G("z"), "z1", 0)
	e.claimFor(10*time.Second, 0, G("z"))
	e.clock.Advance(11 * time.Second)
	lz := e.claimFor(10*time.Second, 0, G("z"))
	is.Equal(lz.Attempt, 2)
	tz := e.clock.Now()
	e.fail(e.tr, lz, "z broke")

	// y: leased on its third attempt, held longest.
	e.publish(G("y"), "y1", 0)
	e.publish(G("y"), "y2", 0)
	e.claimFor(10*time.Second, 0, G("y"))
	e.clock.Advance(11 * time.Second)
	e.claimFor(10*time.Second, 0, G("y"))
	e.clock.Advance(11 * time.Second)
	ty := e.clock.Now()
	ly := e.claimFor(time.Minute, 0, G("y"))
	is.Equal(ly.Attempt, 3)

	// p: paused before any claim.
	e.clock.Advance(time.Second)
	e.publish(G("p"), "p1", 0)
	is.NoErr(op.PauseGroup(e.ctx(), G("p")))

	// k: leased after y.
	e.publish(G("k"), "k1", 0)
	tk := e.clock.Now()
	lk := e.claimFor(time.Minute, 0, G("k"))

	// a: free, never claimed.
	e.publish(G("a"), "a1", 0)

	// d: a dead letter of priority 2 (its group drains and goes).
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 1, RetryBackoffMin: time.Hour, RetryBackoffMax: time.Hour}})
	e.publish(G("d"), "d1", 2)
	e.fail(e.tr, e.claimFor(time.Minute, 2, G("d")), "d died")

	// s: stopped, priority 4.
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 1, OnExhausted: pgtransport.StopGroup, RetryBackoffMin: time.Hour, RetryBackoffMax: time.Hour}})
	e.publish(G("s"), "s1", 4)
	e.fail(e.tr, e.claimFor(time.Minute, 4, G("s")), "s stopped")

	// Every order and filter.
	is.Equal(e.groups(pgtransport.GroupQuery{}), Gs("a", "k", "p", "s", "y", "z"))                                          // by group id
	is.Equal(e.groups(pgtransport.GroupQuery{Order: pgtransport.ByGroup}), Gs("a", "k", "p", "s", "y", "z"))                // the same
	is.Equal(e.groups(pgtransport.GroupQuery{Order: pgtransport.OldestHead}), Gs("z", "y", "p", "k", "a", "s"))             // by head seq
	is.Equal(e.groups(pgtransport.GroupQuery{Order: pgtransport.HeldLongest}), Gs("y", "k"))                                // leased only, earliest holder first
	is.Equal(e.groups(pgtransport.GroupQuery{Order: pgtransport.MostAttempts}), Gs("y", "z"))                               // heads handed out more than once, most first
	is.Equal(e.groups(pgtransport.GroupQuery{State: pgtransport.GroupFree}), Gs("a"))                                       // free
	is.Equal(e.groups(pgtransport.GroupQuery{State: pgtransport.GroupLeased}), Gs("k", "y"))                                // leased
	is.Equal(e.groups(pgtransport.GroupQuery{State: pgtransport.GroupParked}), Gs("z"))                                     // parked
	is.Equal(e.groups(pgtransport.GroupQuery{State: pgtransport.GroupStopped}), Gs("s"))                                    // stopped
	is.Equal(e.groups(pgtransport.GroupQuery{State: pgtransport.GroupPaused}), Gs("p"))                                     // paused
	is.Equal(e.groups(pgtransport.GroupQuery{State: pgtransport.GroupLeased, Order: pgtransport.OldestHead}), Gs("y", "k")) // a filter and an order
	// Paging.
	var paged []string
	for off := 0; off <= 6; off += 2 {
		page := e.groups(pgtransport.GroupQuery{Offset: off, Limit: 2})
		is.True(len(page) <= 2) // at most Limit
		paged = append(paged, page...)
	}
	is.Equal(paged, Gs("a", "k", "p", "s", "y", "z"))                                                       // pages cover the list once, in order
	is.Equal(e.groups(pgtransport.GroupQuery{Order: pgtransport.OldestHead, Offset: 4, Limit: 1}), Gs("a")) // Offset in another order

	// Group's fields, by the transport's clock.
	y := e.group(G("y"))
	is.Equal(y.State, pgtransport.GroupLeased)
	is.Equal(y.Holder, ly.Token) // the holder is the lease token
	is.True(y.LeasedAt.Equal(ty))
	is.True(y.Until.Equal(ty.Add(time.Minute)))
	is.Equal(y.HeadSeq, ly.Seq)
	is.Equal(y.Attempts, 3)
	is.Equal(y.Priority, 0)
	k := e.group(G("k"))
	is.Equal(k.Holder, lk.Token)
	is.True(k.LeasedAt.Equal(tk))
	is.Equal(k.Attempts, 1)
	z := e.group(G("z"))
	is.Equal(z.State, pgtransport.GroupParked)
	is.Equal(z.Holder, "") // a Fail ended the lease
	is.Equal(z.HeadSeq, lz.Seq)
	is.Equal(z.Attempts, 2)
	is.True(z.Until.After(tz) && !z.Until.After(tz.Add(time.Hour+time.Second))) // the backoff's end
	a := e.group(G("a"))
	is.Equal(a, pgtransport.GroupInfo{Group: G("a"), State: pgtransport.GroupFree, HeadSeq: a.HeadSeq, HeadAge: a.HeadAge, Tenant: pgtransport.DefaultTenant})
	is.True(a.HeadSeq > lk.Seq) // published after k1
	s := e.group(G("s"))
	is.Equal(s.State, pgtransport.GroupStopped)
	is.Equal(s.Priority, 4)
	is.True(s.Until.IsZero()) // stopped: the far future shows as zero
	is.Equal(s.Holder, "")
	p := e.group(G("p"))
	is.Equal(p.State, pgtransport.GroupPaused)
	is.Equal(p.Holder, "")
	is.Equal(p.Attempts, 0)
	is.True(!t0.After(y.LeasedAt))

	// Stats: exact counts.
	st, err := op.Stats(e.ctx())
	is.NoErr(err)
	is.Equal(len(st.ByPriority), 5) // every priority, zeros included
	for i, ps := range st.ByPriority {
		is.Equal(ps.Priority, pgtransport.MinPriority+i) // in order
	}
	is.Equal(st.Total.Priority, -1)
	tot := st.Total
	is.Equal([]int64{tot.Groups, tot.Free, tot.Leased, tot.Parked, tot.Stopped, tot.Paused}, []int64{6, 1, 2, 1, 1, 1})
	is.True(tot.GroupsExact && tot.MessagesExact && tot.DeadLettersExact)
	is.Equal(tot.Messages, int64(7)) // z1 y1 y2 p1 k1 a1 s1
	is.Equal(tot.DeadLetters, int64(1))
	p0, p2, p4 := st.ByPriority[0], st.ByPriority[2], st.ByPriority[4]
	is.Equal([]int64{p0.Groups, p0.Free, p0.Leased, p0.Parked, p0.Stopped, p0.Paused, p0.Messages, p0.DeadLetters}, []int64{5, 1, 2, 1, 0, 1, 6, 0})
	is.Equal([]int64{p2.Groups, p2.Messages, p2.DeadLetters}, []int64{0, 0, 1})
	is.Equal([]int64{p4.Groups, p4.Stopped, p4.Messages, p4.DeadLetters}, []int64{1, 1, 1, 0})
	var sum pgtransport.PriorityStats
	for _, ps := range st.ByPriority {
		is.Equal(ps.Groups, ps.Free+ps.Leased+ps.Parked+ps.Stopped+ps.Paused) // the states add up
		sum.Groups += ps.Groups
		sum.Messages += ps.Messages
		sum.DeadLetters += ps.DeadLetters
		sum.Paused += ps.Paused
	}
	is.Equal([]int64{sum.Groups, sum.Messages, sum.DeadLetters, sum.Paused}, []int64{tot.Groups, tot.Messages, tot.DeadLetters, tot.Paused}) // the total adds up
	is.True(tot.OldestHeadAge >= p0.OldestHeadAge && tot.OldestHeadAge >= p4.OldestHeadAge)                                                  // the total's oldest is the oldest
	is.Equal(st.ByPriority[1].OldestHeadAge, time.Duration(0))                                                                               // no message: 0
	is.Equal(st.Waiting, int64(0))
	is.True(time.Since(st.At).Abs() < time.Minute) // read by the server's clock (this machine's)
}

// peekDoesNotLease: Peek shows the next messages in order, with the
// cause of the last Fail, and leaves the head to the next claim.
func peekDoesNotLease(is *is.I, e *env) {
	op := e.op()
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{RetryBackoffMin: time.Second, RetryBackoffMax: time.Second}})
	for i := range 3 {
		e.publish("g", event("g", i), 1)
	}
	ms, err := op.Peek(e.ctx(), "g", 2)
	is.NoErr(err)
	is.Equal(len(ms), 2) // n of them
	is.Equal([]string{ms[0].Event, ms[1].Event}, []string{"g-0", "g-1"})
	is.True(ms[0].Seq < ms[1].Seq)
	is.True(!ms[0].PublishedAt.IsZero()) // published by this schema version
	all, err := op.Peek(e.ctx(), "g", pgtransport.MaxBatch)
	is.NoErr(err)
	is.Equal(len(all), 3) // all there are
	is.Equal(e.group("g").Attempts, 0)

	l := e.claim("w", 0)
	is.Equal(l.Event, "g-0") // Peek leased nothing
	is.Equal(l.Attempt, 1)   // nor counted an attempt
	is.Equal(l.Seq, ms[0].Seq)
	e.fail(e.tr, l, "boom")
	ms, err = op.Peek(e.ctx(), "g", 1)
	is.NoErr(err)
	is.Equal(ms[0].LastError, "boom") // the Fail's cause
	g := e.group("g")
	is.Equal(g.State, pgtransport.GroupParked)
	is.Equal(g.Attempts, 1)
	is.Equal(g.HeadSeq, l.Seq)
	is.Equal(g.Priority, 1)
	e.clock.Advance(2 * time.Second)
	l = e.claim("w", 0)
	is.Equal(l.Event, "g-0")
	is.Equal(l.Attempt, 2) // the Peeks in between counted nothing
	for _, n := range []int{0, -1, pgtransport.MaxBatch + 1} {
		_, err := op.Peek(e.ctx(), "g", n)
		is.True(errors.Is(err, pgtransport.ErrInvalidBatch)) // n out of range
	}
}

// pauseStopsEveryClaim: no claim of any kind hands out a paused group;
// a holder mid-message settles its lease and the group is not handed on;
// resume puts it back, its messages in order.
func pauseStopsEveryClaim(is *is.I, e *env) {
	op := e.op()
	for i := range 3 {
		e.publish("g", event("g", i), 0)
	}
	is.NoErr(op.ResumeGroup(e.ctx(), "g")) // not paused: nothing to do
	is.NoErr(op.PauseGroup(e.ctx(), "g"))
	is.NoErr(op.PauseGroup(e.ctx(), "g")) // idempotent
	is.Equal(e.claim("w", 0), nil)        // Claim
	ls, err := e.tr.ClaimMany(e.ctx(), "w", time.Minute, 0, 10)
	is.NoErr(err)
	is.Equal(len(ls), 0) // ClaimMany
	wctx, cancel := context.WithTimeout(e.ctx(), 300*time.Millisecond)
	l, err := e.tr.ClaimWait(wctx, "w", time.Minute, 0)
	cancel()
	is.Equal(l, nil)                                  // ClaimWait
	is.True(errors.Is(err, context.DeadlineExceeded)) // it waited for work that never came
	e.clock.Advance(48 * time.Hour)
	is.Equal(e.claim("w", 0), nil) // however long

	// A holder mid-message: h is paused under its lease. The claim must
	// be h's, not x's (never-served groups in arrival order): they share
	// a partition.
	hx := e.local("h", "x")
	hg, xg := hx[0], hx[1]
	e.publish(hg, "h-0", 0)
	e.publish(hg, "h-1", 0)
	e.publish(hg, "h-2", 0)
	e.publish(xg, "x-0", 0)
	lh := e.claimFor(time.Minute, 0, hg)
	is.NoErr(op.PauseGroup(e.ctx(), hg))
	h := e.group(hg)
	is.Equal(h.State, pgtransport.GroupPaused)
	is.Equal(h.Holder, lh.Token)                    // still finishing its message
	is.NoErr(e.tr.Extend(e.ctx(), lh, time.Minute)) // the lease holds
	next, err := e.tr.AckNext(e.ctx(), lh, time.Minute)
	is.NoErr(err)       // the holder acks
	is.Equal(next, nil) // AckNext did not keep h, which has two more messages
	e.ack(e.claimFor(time.Minute, 0, xg))
	is.Equal(e.claim("w", 0), nil) // nor will any claim hand h out
	h = e.group(hg)
	is.Equal(h.State, pgtransport.GroupPaused)
	is.Equal(h.Holder, "")
	ps, err := op.Peek(e.ctx(), hg, 10)
	is.NoErr(err)
	is.Equal(len(ps), 2) // h-0 acked, h-1 and h-2 kept

	// Work hands out other groups' messages, never a paused group's; a
	// group paused under one of its handlers is not kept for the slot's
	// next message (harel_ack_claim's keep).
	var (
		mu   stdsync.Mutex
		seen []string
	)
	inW, release := make(chan struct{}, 1), make(chan struct{})
	handler := func(ctx context.Context, l *pgtransport.Lease) error {
		if l.Event == "w-0" {
			inW <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, l.Event)
		return nil
	}
	for i := range 5 {
		e.publish(fmt.Sprintf("o%d", i), "o", 0)
	}
	for i := range 3 {
		e.publish("w", event("w", i), 0)
	}
	wctx, stop := context.WithCancel(e.ctx())
	workErr := make(chan error, 1)
	go func() {
		workErr <- op.Work(wctx, pgtransport.WorkerConfig{WorkerID: "r", Concurrency: 2, ShutdownTimeout: time.Second}, handler)
	}()
	select {
	case <-inW:
	case <-time.After(30 * time.Second):
		e.t.Fatal("Work never took w within 30 s")
	}
	is.NoErr(op.PauseGroup(e.ctx(), "w"))
	close(release)
	e.until("w-0 acked and the o's handled", func() bool {
		head, err := op.Peek(e.ctx(), "w", 1)
		m, _ := e.rows()
		return err == nil && len(head) == 1 && head[0].Event == "w-1" && m == 7 // g-0..2, h-1..2, w-1..2
	})
	w := e.group("w")
	is.Equal(w.State, pgtransport.GroupPaused)
	is.Equal(w.Holder, "") // the ack did not keep the paused group

	// Resume while Work runs: it gets their messages, in order.
	mu.Lock()
	seen = append(seen, "resumed")
	mu.Unlock()
	is.NoErr(op.ResumeGroup(e.ctx(), "g"))
	is.NoErr(op.ResumeGroup(e.ctx(), hg))
	is.NoErr(op.ResumeGroup(e.ctx(), "w"))
	e.until("the resumed groups drained", func() bool { m, _ := e.rows(); return m == 0 })
	stop()
	is.NoErr(<-workErr)
	mu.Lock()
	defer mu.Unlock()
	byGroup := map[byte][]string{}
	for _, ev := range seen {
		byGroup[ev[0]] = append(byGroup[ev[0]], ev)
	}
	at := slices.Index(seen, "resumed")
	is.Equal(len(byGroup['o']), 5)                                                              // the other groups flowed
	is.Equal(slices.Sorted(slices.Values(seen[:at])), []string{"o", "o", "o", "o", "o", "w-0"}) // nothing of g or h while paused, nor w after its pause
	is.Equal(byGroup['g'], []string{"g-0", "g-1", "g-2"})                                       // resumed, in order
	is.Equal(byGroup['h'], []string{"h-1", "h-2"})
	is.Equal(byGroup['w'], []string{"w-0", "w-1", "w-2"})
}

// pausedGroupKeepsItsRowWhenDrained: a paused group whose last message
// is acked stays (Group answers, HeadSeq 0); a publish to it stays
// unclaimed; resume puts it back, and a resume of a drained group deletes
// its row.
func pausedGroupKeepsItsRowWhenDrained(is *is.I, e *env) {
	op := e.op()
	e.publish("g", "g-0", 3)
	l := e.claim("w", 0)
	is.NoErr(op.PauseGroup(e.ctx(), "g"))
	e.ack(l)
	g := e.group("g")
	is.Equal(g.State, pgtransport.GroupPaused) // still there
	is.Equal(g.HeadSeq, int64(0))              // empty
	is.Equal(g.Priority, 3)
	m, n := e.rows()
	is.Equal([]int{m, n}, []int{0, 1})
	is.NoErr(op.PauseGroup(e.ctx(), "g")) // idempotent on an empty group
	ms, err := op.Peek(e.ctx(), "g", 5)
	is.NoErr(err)
	is.Equal(len(ms), 0) // a known group with no message

	e.publish("g", "g-1", 0)
	is.Equal(e.claim("w", 0), nil) // still paused
	is.NoErr(op.ResumeGroup(e.ctx(), "g"))
	is.NoErr(op.ResumeGroup(e.ctx(), "g")) // idempotent
	l = e.claim("w", 0)
	is.Equal(l.Event, "g-1") // back in the round-robin
	is.NoErr(op.PauseGroup(e.ctx(), "g"))
	e.ack(l)
	is.NoErr(op.ResumeGroup(e.ctx(), "g"))
	_, err = op.Group(e.ctx(), "g")
	is.True(errors.Is(err, pgtransport.ErrUnknownGroup)) // the resume deleted the drained group's row
	is.Equal(e.claim("w", 0), nil)                       // nothing to hand out
	m, n = e.rows()
	is.Equal(m+n, 0)
}

// purgeFencesTheHolder: PurgeGroup deletes the oldest messages, ends
// the holder's lease (every later settle is ErrLeaseLost), ends a stop,
// keeps a pause, and leaves later messages to the next claim.
func purgeFencesTheHolder(is *is.I, e *env) {
	op := e.op()
	for i := range 5 {
		e.publish("g", event("g", i), 0)
	}
	l := e.claim("w", 0)
	n, err := op.PurgeGroup(e.ctx(), "g", 2)
	is.NoErr(err)
	is.Equal(n, int64(2)) // the limit
	for name, settle := range map[string]func() error{
		"ack":    func() error { return e.tr.Ack(e.ctx(), l) },
		"nack":   func() error { return e.tr.Nack(e.ctx(), l, 0) },
		"extend": func() error { return e.tr.Extend(e.ctx(), l, time.Minute) },
		"fail":   func() error { return e.tr.Fail(e.ctx(), l, errors.New("late")) },
	} {
		if err := settle(); !errors.Is(err, pgtransport.ErrLeaseLost) {
			e.t.Errorf("%s after purge: %v, want ErrLeaseLost", name, err)
		}
	}
	l = e.claim("w", 0)
	is.Equal(l.Event, "g-2") // the oldest two went
	is.Equal(l.Attempt, 1)

	// A paused group stays paused; its holder is fenced off.
	is.NoErr(op.PauseGroup(e.ctx(), "g"))
	n, err = op.PurgeGroup(e.ctx(), "g", 0)
	is.NoErr(err)
	is.Equal(n, int64(3)) // all
	is.True(errors.Is(e.tr.Ack(e.ctx(), l), pgtransport.ErrLeaseLost))
	g := e.group("g")
	is.Equal(g.State, pgtransport.GroupPaused)
	is.Equal(g.HeadSeq, int64(0))
	is.Equal(g.Holder, "")
	n, err = op.PurgeGroup(e.ctx(), "g", 0)
	is.NoErr(err)
	is.Equal(n, int64(0)) // nothing left
	e.publish("g", "g-5", 0)
	is.NoErr(op.ResumeGroup(e.ctx(), "g"))
	l = e.claim("w", 0)
	is.Equal(l.Event, "g-5") // published after the purge: kept
	e.ack(l)

	// A stopped group: the purge of its head ends the stop.
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 1, OnExhausted: pgtransport.StopGroup}})
	e.publish("s", "s-0", 0)
	e.publish("s", "s-1", 0)
	e.fail(e.tr, e.claim("w", 0), "stop")
	is.Equal(e.group("s").State, pgtransport.GroupStopped)
	n, err = op.PurgeGroup(e.ctx(), "s", 1)
	is.NoErr(err)
	is.Equal(n, int64(1))
	l = e.claim("w", 0)
	is.Equal(l.Event, "s-1") // claimable again
	is.Equal(l.Attempt, 1)
	e.ack(l)
	m, _ := e.rows()
	is.Equal(m, 0)
}

// refusalsWriteNothing: unknown groups, invalid ids and queries get
// their sentinels, and nothing changes.
func refusalsWriteNothing(is *is.I, e *env) {
	op := e.op()
	e.publish("g", "g-0", 0)
	before := e.group("g")
	ctx := e.ctx()
	calls := map[string]func(group string) error{
		"group":  func(g string) error { _, err := op.Group(ctx, g); return err },
		"peek":   func(g string) error { _, err := op.Peek(ctx, g, 1); return err },
		"pause":  func(g string) error { return op.PauseGroup(ctx, g) },
		"resume": func(g string) error { return op.ResumeGroup(ctx, g) },
		"purge":  func(g string) error { _, err := op.PurgeGroup(ctx, g, 0); return err },
	}
	for _, name := range slices.Sorted(maps.Keys(calls)) {
		call := calls[name]
		if err := call("never"); !errors.Is(err, pgtransport.ErrUnknownGroup) {
			e.t.Errorf("%s of a group never published: %v, want ErrUnknownGroup", name, err)
		}
		for _, bad := range []string{"", "a\x00b"} {
			if err := call(bad); !errors.Is(err, pgtransport.ErrInvalidGroup) {
				e.t.Errorf("%s of %q: %v, want ErrInvalidGroup", name, bad, err)
			}
		}
	}
	for _, q := range []pgtransport.GroupQuery{
		{State: "stuck"}, {Order: "newest"}, {Offset: -1}, {Limit: -1}, {State: "PAUSED"},
	} {
		_, err := op.Groups(ctx, q)
		is.True(errors.Is(err, pgtransport.ErrInvalidQuery)) // refused
	}
	_, err := op.Groups(ctx, pgtransport.GroupQuery{Limit: pgtransport.MaxBatch + 1})
	is.True(errors.Is(err, pgtransport.ErrInvalidBatch)) // a page past MaxBatch
	gs, err := op.Groups(ctx, pgtransport.GroupQuery{Limit: pgtransport.MaxBatch})
	is.NoErr(err)
	is.Equal(len(gs), 1) // MaxBatch itself is fine
	_, err = op.PurgeGroup(ctx, "g", -1)
	is.True(errors.Is(err, pgtransport.ErrInvalidBatch)) // a negative limit

	after := e.group("g")
	after.HeadAge = before.HeadAge // the only field time moves
	is.Equal(after, before)        // nothing changed
	m, n := e.rows()
	is.Equal([]int{m, n}, []int{1, 1})
	l := e.claim("w", 0)
	is.Equal(l.Event, "g-0")
	is.Equal(l.Attempt, 1)
}
