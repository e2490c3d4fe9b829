package core

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// TestStatsByTheServerClock: on the server's clock, Stats counts groups by
// state and priority and messages exactly on a small queue, measures the
// oldest head's age, and counts the idle ClaimWait callers.
func TestStatsByTheServerClock(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 8)
	ctx := pgtest.Context(t)
	c, err := New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema})
	is.NoErr(err)

	const gap = 400 * time.Millisecond
	_, err = c.Publish(ctx, "a", "a1", 0)
	is.NoErr(err)
	time.Sleep(gap) // the age being measured
	for _, m := range []pgtransport.Message{{Group: "b", Event: "b1", Priority: 2}, {Group: "b", Event: "b2", Priority: 2}, {Group: "c", Event: "c1", Priority: 0}} {
		_, err := c.PublishMessage(ctx, m)
		is.NoErr(err)
	}
	l, err := c.Claim(ctx, "w", time.Minute, 2)
	is.NoErr(err)
	is.Equal(l.Group, "b")
	is.NoErr(c.PauseGroup(ctx, "c"))

	// Idle consumers, for the waiters count, registered as a stream
	// registers (the blocking ClaimWait registers none): one live, one
	// whose registration ran out.
	_, _, err = c.Wait(ctx, "idle", 4, time.Minute)
	is.NoErr(err)
	_, _, err = c.Wait(ctx, "gone", 0, time.Millisecond)
	is.NoErr(err)
	time.Sleep(5 * time.Millisecond) // until "gone" ran out

	s, err := c.Stats(ctx)
	is.NoErr(err)
	is.Equal(s.Waiting, int64(1)) // the live registration
	is.Equal(len(s.ByPriority), 5)
	tot := s.Total
	is.Equal([]int64{tot.Groups, tot.Free, tot.Leased, tot.Parked, tot.Stopped, tot.Paused, tot.Messages, tot.DeadLetters}, []int64{3, 1, 1, 0, 0, 1, 4, 0})
	p0, p2 := s.ByPriority[0], s.ByPriority[2]
	is.Equal([]int64{p0.Groups, p0.Free, p0.Paused, p0.Messages}, []int64{2, 1, 1, 2})
	is.Equal([]int64{p2.Groups, p2.Leased, p2.Messages}, []int64{1, 1, 2})
	is.True(tot.OldestHeadExact && p0.OldestHeadExact && p2.OldestHeadExact && tot.MessagesExact)
	// a1 waited gap before b1 was published, and the rest came at once.
	is.True(tot.OldestHeadAge >= gap && tot.OldestHeadAge < gap+10*time.Second) // a1's age
	is.Equal(p0.OldestHeadAge, tot.OldestHeadAge)                               // a1 is priority 0's oldest
	is.True(p2.OldestHeadAge >= 0 && p2.OldestHeadAge <= tot.OldestHeadAge-gap) // b1 came gap later
	is.True(p2.OldestHeadAge < tot.OldestHeadAge)
	is.Equal(s.ByPriority[1].OldestHeadAge, time.Duration(0)) // no message
	is.True(time.Since(s.At).Abs() < time.Minute)             // the server's clock is this machine's

	// Group by the server's clock: LeasedAt and Until bracket the claim.
	g, err := c.Group(ctx, "b")
	is.NoErr(err)
	is.Equal(g.Holder, l.Token)
	is.True(g.LeasedAt.Before(l.Expiry) && time.Since(g.LeasedAt).Abs() < time.Minute)
	is.True(g.Until.Sub(g.LeasedAt).Round(time.Millisecond) == time.Minute) // the visibility
	is.Equal(g.HeadSeq, l.Seq)
	is.True(g.HeadAge >= 0 && g.HeadAge < tot.OldestHeadAge)
	a, err := c.Group(ctx, "a")
	is.NoErr(err)
	is.True(a.HeadAge >= gap) // a1's age again
}

// TestOpsRefuseBeforeAnyRoundTrip: bad arguments are refused with their
// sentinel before the core touches its pool: here a closed one, which
// would answer ErrClosed.
func TestOpsRefuseBeforeAnyRoundTrip(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	ctx := pgtest.Context(t)
	c, err := New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema})
	is.NoErr(err)
	db.Pool.Close()
	_, err = c.Group(ctx, "g")
	is.True(errors.Is(err, pgtransport.ErrClosed)) // a good call does reach the pool

	for _, q := range []pgtransport.GroupQuery{{State: "nope"}, {Order: "nope"}, {Offset: -1}, {Limit: -1}} {
		_, err := c.Groups(ctx, q)
		is.True(errors.Is(err, pgtransport.ErrInvalidQuery)) // no round-trip
	}
	_, err = c.Groups(ctx, pgtransport.GroupQuery{Limit: pgtransport.MaxBatch + 1})
	is.True(errors.Is(err, pgtransport.ErrInvalidBatch))
	_, err = c.Peek(ctx, "g", 0)
	is.True(errors.Is(err, pgtransport.ErrInvalidBatch))
	_, err = c.PurgeGroup(ctx, "g", -1)
	is.True(errors.Is(err, pgtransport.ErrInvalidBatch))
	for _, bad := range []string{"", "x\x00y"} {
		_, err = c.Group(ctx, bad)
		is.True(errors.Is(err, pgtransport.ErrInvalidGroup))
		_, err = c.Peek(ctx, bad, 1)
		is.True(errors.Is(err, pgtransport.ErrInvalidGroup))
		is.True(errors.Is(c.PauseGroup(ctx, bad), pgtransport.ErrInvalidGroup))
		is.True(errors.Is(c.ResumeGroup(ctx, bad), pgtransport.ErrInvalidGroup))
		_, err = c.PurgeGroup(ctx, bad, 0)
		is.True(errors.Is(err, pgtransport.ErrInvalidGroup))
	}
}

// TestOpsRace: publishers, consumers (Claim+Ack, AckNext, AckClaim) and an
// operator pausing, resuming and purging, all at once. Every message of a
// group never purged is handed out once, in order, and acked; no such
// group is ever held by two consumers at once; a purged group loses only
// messages whose publish began before its last purge returned; nothing is
// acked twice.
func TestOpsRace(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 16)
	ctx := pgtest.Context(t)
	c, err := New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema})
	is.NoErr(err)

	const perGroup = 40
	kept := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	purged := []string{"p0", "p1", "p2"}
	all := append(append([]string{}, kept...), purged...)
	isKept := map[string]bool{}
	for _, g := range kept {
		isKept[g] = true
	}

	errs := make(chan error, 100)
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}

	var (
		mu        sync.Mutex
		holder    = map[string]string{} // kept group -> the consumer holding it
		next      = map[string]int{}    // kept group -> the event it must hand out next
		acked     = map[int64]bool{}
		started   = map[int64]time.Time{} // purged groups' seqs -> when their publish began
		seqGroup  = map[int64]string{}
		lastPurge = map[string]time.Time{}
	)
	// take checks a lease handed to consumer who.
	take := func(who string, l *pgtransport.Lease) {
		mu.Lock()
		defer mu.Unlock()
		if !isKept[l.Group] {
			return
		}
		if h := holder[l.Group]; h != "" {
			report(fmt.Errorf("%s: group %s handed to %s while %s holds it", l.Event, l.Group, who, h))
		}
		holder[l.Group] = who
		if want := strconv.Itoa(next[l.Group]); l.Event != want {
			report(fmt.Errorf("group %s: handed out %s, want %s", l.Group, l.Event, want))
		}
	}
	// done marks l handled, before its ack: once acked, the group may go
	// to another consumer at once.
	done := func(l *pgtransport.Lease) {
		mu.Lock()
		defer mu.Unlock()
		if isKept[l.Group] {
			holder[l.Group] = ""
			next[l.Group]++
		}
	}
	ackedOK := func(l *pgtransport.Lease, err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
			if acked[l.Seq] {
				report(fmt.Errorf("seq %d acked twice", l.Seq))
			}
			acked[l.Seq] = true
		case isKept[l.Group] || !errors.Is(err, pgtransport.ErrLeaseLost):
			report(fmt.Errorf("ack %s/%s: %w", l.Group, l.Event, err))
		}
	}

	// Publishers: one per half of the groups, so each group's events go
	// in order.
	var pubs, ops sync.WaitGroup
	for p := range 2 {
		pubs.Go(func() {
			for i := range perGroup {
				for j, g := range all {
					if j%2 != p {
						continue
					}
					began := time.Now()
					seq, err := c.Publish(ctx, g, strconv.Itoa(i), 0)
					if err != nil {
						report(fmt.Errorf("publish: %w", err))
						return
					}
					mu.Lock()
					seqGroup[seq] = g
					if !isKept[g] {
						started[seq] = began
					}
					mu.Unlock()
				}
			}
		})
	}

	// The operator, until the publishers are done.
	pubsDone := make(chan struct{})
	ops.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-pubsDone:
				for _, g := range all {
					if err := c.ResumeGroup(ctx, g); err != nil && !errors.Is(err, pgtransport.ErrUnknownGroup) {
						report(fmt.Errorf("final resume %s: %w", g, err))
					}
				}
				return
			default:
			}
			g := all[rng.IntN(len(all))]
			var err error
			switch rng.IntN(3) {
			case 0:
				err = c.PauseGroup(ctx, g)
			case 1:
				err = c.ResumeGroup(ctx, g)
			case 2:
				p := purged[rng.IntN(len(purged))]
				_, err = c.PurgeGroup(ctx, p, rng.IntN(3))
				if err == nil {
					mu.Lock()
					lastPurge[p] = time.Now()
					mu.Unlock()
				}
			}
			if err != nil && !errors.Is(err, pgtransport.ErrUnknownGroup) {
				report(fmt.Errorf("operator on %s: %w", g, err))
			}
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
		}
	})

	// Consumers.
	cctx, stop := context.WithCancel(ctx)
	var cons sync.WaitGroup
	for k := range 3 {
		who := "c" + strconv.Itoa(k)
		cons.Go(func() {
			var l *pgtransport.Lease
			for {
				if l == nil {
					var err error
					l, err = c.ClaimWait(cctx, who, 30*time.Second, 0)
					if cctx.Err() != nil {
						return
					}
					if err != nil {
						report(fmt.Errorf("claim: %w", err))
						return
					}
					take(who, l)
				}
				done(l)
				switch k {
				case 0:
					ackedOK(l, c.Ack(ctx, l))
					l = nil
				case 1:
					n, err := c.AckNext(ctx, l, 30*time.Second)
					ackedOK(l, err)
					if l = n; l != nil {
						take(who, l)
					}
				case 2:
					n, ackErr, err := c.AckClaim(ctx, l, who, 30*time.Second, 0)
					if err != nil {
						report(fmt.Errorf("ack claim: %w", err))
						return
					}
					ackedOK(l, ackErr)
					if l = n; l != nil {
						take(who, l)
					}
				}
			}
		})
	}

	pubs.Wait()
	close(pubsDone)
	ops.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		is.NoErr(db.Pool.QueryRow(ctx, `SELECT count(*) FROM transport_messages`).Scan(&n))
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages never drained", n)
		}
		time.Sleep(10 * time.Millisecond) // only the table shows the drain
	}
	stop()
	cons.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	mu.Lock()
	defer mu.Unlock()
	for _, g := range kept {
		is.Equal(next[g], perGroup) // every message of a group never purged, once, in order
	}
	var lost, keptAfter int
	for seq, began := range started {
		if acked[seq] {
			continue
		}
		if p := lastPurge[seqGroup[seq]]; !p.IsZero() && began.After(p) {
			t.Errorf("seq %d of %s, published after its group's last purge, was lost", seq, seqGroup[seq])
		}
		lost++
	}
	for seq, began := range started {
		if p := lastPurge[seqGroup[seq]]; acked[seq] && began.After(p) {
			keptAfter++
		}
	}
	t.Logf("purged groups: %d of %d messages purged, %d published after the last purge", lost, len(started), keptAfter)
	is.True(lost > 0) // the purges did purge something
	is.Equal(len(acked)+lost, len(seqGroup))
}
