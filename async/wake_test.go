package async_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// Wake-up tests run with IdleSweep at a minute: a lease that arrives within
// seconds came by a notification, an in-process wake-up or the expiry
// timer, never by the fallback sweep.
const noSweep = time.Minute

// plainPublish publishes the way another language would: the design's two
// statements, no Go transport involved.
func plainPublish(t *testing.T, db *pgtest.DB, group, event string) {
	t.Helper()
	err := pgx.BeginFunc(ctx(t), db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx(t), `INSERT INTO transport_messages (group_id, event) VALUES ($1, $2)`, group, event); err != nil {
			return err
		}
		_, err := tx.Exec(ctx(t), `INSERT INTO transport_groups (group_id, locked_by, lock_expiry, priority) VALUES ($1, NULL, NULL, 0) ON CONFLICT (group_id) DO NOTHING`, group)
		return err
	})
	if err != nil {
		t.Fatalf("plain publish: %v", err)
	}
}

// channelOf returns the NOTIFY channel of db's queue.
func channelOf(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	var channel string
	if err := db.Pool.QueryRow(ctx(t), `SELECT harel_channel()`).Scan(&channel); err != nil {
		t.Fatal(err)
	}
	return channel
}

// listenTo returns a function that counts the notifications on db's channel
// since its last call (it waits 300 ms for each).
func listenTo(t *testing.T, db *pgtest.DB) func() int {
	t.Helper()
	conn := db.Conn(t)
	if _, err := conn.Exec(ctx(t), `LISTEN `+pgx.Identifier{channelOf(t, db)}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return func() int {
		n := 0
		for {
			c, cancel := context.WithTimeout(ctx(t), 300*time.Millisecond)
			_, err := conn.WaitForNotification(c)
			cancel()
			if err != nil {
				return n
			}
			n++
		}
	}
}

// waitArmed waits until n consumers have said they are idle: their waiter
// rows are the only sign of it.
func waitArmed(t *testing.T, db *pgtest.DB, n int) {
	t.Helper()
	eventually(t, time.Minute, fmt.Sprint(n, " waiters"), func() bool {
		return count(t, db, `SELECT count(*) FROM transport_waiters`) == n
	})
}

// TestPlainPublishWakes: an idle stream wakes for a message published with
// plain SQL from another connection, every time.
func TestPlainPublishWakes(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, db := setup(t, pgtransport.Config{IdleSweep: noSweep})
	s := stream(t, tr, async.StreamConfig{})
	var worst time.Duration
	for i := range 20 {
		waitArmed(t, db, 1)
		start := time.Now()
		plainPublish(t, db, fmt.Sprint("g", i), "e")
		l := receive(t, s, 10*time.Second)
		worst = max(worst, time.Since(start))
		is.Equal(l.Group, fmt.Sprint("g", i))
		is.NoErr(<-tr.Ack(ctx(t), l))
	}
	t.Logf("slowest of 20 wake-ups: %v (latency figures: make bench)", worst)
}

// TestWhichWritesNotify: publishers notify only while a consumer waits, once
// per transaction however many groups it creates, and only on the queue's
// own channel.
func TestWhichWritesNotify(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, db := setup(t, pgtransport.Config{IdleSweep: noSweep})
	notes := listenTo(t, db)

	// Nobody idle: new groups, existing groups, plain SQL or not: silence.
	for i := range 20 {
		is.NoErr((<-tr.Publish(ctx(t), fmt.Sprint("busy", i), "e", 0)).Err)
		is.NoErr((<-tr.Publish(ctx(t), fmt.Sprint("busy", i), "e2", 0)).Err)
	}
	plainPublish(t, db, "plain", "e")
	is.Equal(notes(), 0)
	_, err := db.Pool.Exec(ctx(t), `DELETE FROM transport_messages; DELETE FROM transport_groups`)
	is.NoErr(err)

	// A consumer waiting at priority 3: a priority-0 group does not concern it.
	s, err := tr.Stream(ctx(t), async.StreamConfig{WorkerID: "w", Visibility: time.Minute, MinPriority: 3})
	is.NoErr(err)
	t.Cleanup(s.Close)
	waitArmed(t, db, 1)
	is.NoErr((<-tr.Publish(ctx(t), "low", "e", 0)).Err)
	is.Equal(notes(), 0)

	// One transaction creating 50 groups at priority 3: one notification.
	_, err = db.Pool.Exec(ctx(t), `SELECT harel_publish('hi' || i, 'e', 3) FROM generate_series(1, 50) AS i`)
	is.NoErr(err)
	is.Equal(notes(), 1)
}

// TestSchemasDoNotWakeEachOther: two queues on one pool (so one LISTEN
// connection): a publish in one never wakes the other's consumer.
func TestSchemasDoNotWakeEachOther(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	a, _, dbA := setup(t, pgtransport.Config{IdleSweep: noSweep})
	dbB := pgtest.New(t, 4)
	b := open(t, dbA.Pool, pgtransport.Config{Schema: dbB.Schema, IdleSweep: noSweep})
	is.True(channelOf(t, dbA) != channelOf(t, dbB)) // each queue has its own channel

	sA := stream(t, a, async.StreamConfig{})
	sB := stream(t, b, async.StreamConfig{})
	waitArmed(t, dbA, 1)
	waitArmed(t, dbB, 1)
	// A woken consumer refreshes its waiter row when it looks again; B's
	// must stay as it is. First let the wake-ups of B's channel joining the
	// listener settle: B's row unchanged for 300 ms. Kept as a quiet period:
	// those wake-ups are coalesced into one pending hint, and nothing but the
	// row they refresh shows whether B has taken it yet.
	until := func() float64 {
		var u float64
		is.NoErr(dbB.Pool.QueryRow(ctx(t), `SELECT until FROM transport_waiters`).Scan(&u))
		return u
	}
	before := until()
	for settled := time.Now(); time.Since(settled) < 300*time.Millisecond; time.Sleep(10 * time.Millisecond) {
		if u := until(); u != before {
			before, settled = u, time.Now()
		}
	}
	plainPublish(t, dbA, "g", "for A")
	l := receive(t, sA, 10*time.Second)
	is.Equal(l.Event, "for A")
	// Kept: it shows that B does not wake. A misrouted wake-up would reach B
	// with A's, and B's look and re-arm take two round-trips, well inside
	// 200 ms; nothing signals a wake-up that does not happen.
	time.Sleep(200 * time.Millisecond)
	is.Equal(until(), before) // B slept through it
	plainPublish(t, dbB, "g", "for B")
	is.Equal(receive(t, sB, 10*time.Second).Event, "for B") // and B does wake for its own
}

// TestExpiryWakes: parked groups and abandoned leases send no notification;
// an idle stream still takes a parked group as soon as its park ends (the
// park's end is in the due index, which harel_wait reads) and an
// abandoned lease at its next idle sweep after the lease's end (no index
// holds a lease's end: see "The sweep" in schema/sql/functions/30_claim.sql).
func TestExpiryWakes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		park  bool // nack with a delay; else the holder just goes away
		sweep time.Duration
	}{
		{"LeaseAbandoned", false, 300 * time.Millisecond},
		{"NackParks", true, noSweep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			tr, st, db := setup(t, pgtransport.Config{IdleSweep: tc.sweep})
			_, err := st.Publish(ctx(t), "g", "e", 0)
			is.NoErr(err)
			l, err := st.Claim(ctx(t), "gone", pgtransport.MinVisibility, 0)
			is.NoErr(err)
			if tc.park {
				is.NoErr(st.Nack(ctx(t), l, 700*time.Millisecond))
			}
			var expiry float64
			is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT lock_expiry FROM transport_groups`).Scan(&expiry))
			s := stream(t, tr, async.StreamConfig{})
			got := receive(t, s, 10*time.Second)
			var now float64
			is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT extract(epoch FROM clock_timestamp())`).Scan(&now))
			is.Equal(got.Event, "e")
			t.Logf("received %.1f ms after the lock_expiry (latency figures: make bench)", (now-expiry)*1000)
		})
	}
}

// TestLocalAckWakes: an ack that frees a group with messages left makes no
// new group row and sends no notification; a stream in the same process
// wakes at once anyway.
func TestLocalAckWakes(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, db := setup(t, pgtransport.Config{IdleSweep: noSweep})
	is.NoErr((<-tr.Publish(ctx(t), "g", "1", 0)).Err)
	is.NoErr((<-tr.Publish(ctx(t), "g", "2", 0)).Err)
	l := (<-tr.Claim(ctx(t), "holder", time.Minute, 0)).Value
	is.True(l != nil)
	s := stream(t, tr, async.StreamConfig{})
	waitArmed(t, db, 1) // idle: g is held
	is.NoErr(<-tr.Ack(ctx(t), l))
	is.Equal(receive(t, s, 10*time.Second).Event, "2")
}

// TestNotifyOff: with notifications off, consumers never ask publishers to
// notify, nothing is sent, and idle streams still find work by sweeping.
func TestNotifyOff(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, db := setup(t, pgtransport.Config{IdleSweep: 50 * time.Millisecond, Async: pgtransport.AsyncConfig{DisableNotify: true}})
	notes := listenTo(t, db)
	s := stream(t, tr, async.StreamConfig{})
	// Kept: the case is about what idle sweeps do over time, and a sweep
	// that finds nothing leaves no trace to wait for; 200 ms is four sweeps.
	time.Sleep(200 * time.Millisecond)
	is.Equal(count(t, db, `SELECT count(*) FROM transport_waiters`), 0)
	plainPublish(t, db, "g", "e")
	is.Equal(receive(t, s, 10*time.Second).Event, "e")
	is.Equal(notes(), 0) // no notification was sent
}

// TestListenerKilled: the LISTEN connection is killed again and again while
// publishers keep going; the listener reconnects and every message is
// delivered, in order per group, exactly as published.
func TestListenerKilled(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, db := setup(t, pgtransport.Config{IdleSweep: noSweep})
	s := stream(t, tr, async.StreamConfig{MaxInFlight: 4})

	const groups, per = 60, 5
	var (
		kills    atomic.Int32
		pubDone  = make(chan struct{})
		killDone = make(chan struct{})
	)
	go func() { // publisher: plain SQL, so only notifications and sweeps wake the stream
		defer close(pubDone)
		for i := range per {
			for g := range groups {
				plainPublish(t, db, fmt.Sprint("g", g), fmt.Sprint(i))
				if rand.IntN(10) == 0 {
					time.Sleep(time.Millisecond) // kept: irregular pacing, so kills land between publishes
				}
			}
		}
	}()
	go func() { // killer
		defer close(killDone)
		for {
			select {
			case <-pubDone:
				return
			case <-time.After(30 * time.Millisecond):
			}
			// The listener's own backend: its last statement may be the
			// LISTEN of its probe channel rather than of ours.
			pid := async.ListenerPID(tr)
			if pid == 0 {
				continue // reconnecting
			}
			var n int
			err := db.Pool.QueryRow(ctx(t), `SELECT count(pg_terminate_backend(pid))::int FROM pg_stat_activity
				WHERE pid = $1 AND query ILIKE 'listen %'`, int32(pid)).Scan(&n)
			if err != nil {
				t.Errorf("kill: %v", err)
				return
			}
			kills.Add(int32(n))
		}
	}()
	next := map[string]int{}
	for range groups * per {
		l := receive(t, s, 30*time.Second)
		if want := fmt.Sprint(next[l.Group]); l.Event != want {
			t.Fatalf("group %s: got %s, want %s", l.Group, l.Event, want)
		}
		next[l.Group]++
		is.NoErr(<-tr.Ack(ctx(t), l))
	}
	<-killDone
	t.Logf("listener killed %d times", kills.Load())
	is.True(kills.Load() > 0)
	is.Equal(count(t, db, `SELECT count(*) FROM transport_messages`), 0)
}

// TestStartCloseStress starts and closes transports and streams on one pool
// from many goroutines at once, with work in flight; run under -race, with
// TestMain's leak check. Nothing published is lost.
func TestStartCloseStress(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 24)
	cfg := pgtransport.Config{Schema: db.Schema, IdleSweep: 20 * time.Millisecond}
	var published, acked atomic.Int64
	var wg stdsync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for i := range 8 {
				tr, err := async.New(ctx(t), db.Pool, cfg)
				if err != nil {
					t.Error(err)
					return
				}
				s1, err1 := tr.Stream(ctx(t), async.StreamConfig{WorkerID: "a", Visibility: time.Minute, MaxInFlight: 2})
				s2, err2 := tr.Stream(ctx(t), async.StreamConfig{WorkerID: "b", Visibility: time.Minute})
				if err := errors.Join(err1, err2); err != nil {
					t.Error(err)
					tr.Close()
					return
				}
				for j := range 3 {
					if (<-tr.Publish(ctx(t), fmt.Sprint("g", w, "-", i, "-", j), "e", 0)).Err == nil {
						published.Add(1)
					}
				}
				select {
				case l, ok := <-s1.C():
					if ok && <-tr.Ack(ctx(t), l) == nil {
						acked.Add(1)
					}
				case <-time.After(time.Duration(rand.IntN(20)) * time.Millisecond):
				}
				if i%2 == 0 {
					s2.Close()
				}
				tr.Close()
				for _, s := range []*async.Stream{s1, s2} {
					_, ok := <-s.C()
					is.True(!ok) // closed with the transport
					is.True(errors.Is(s.Err(), pgtransport.ErrClosed))
				}
			}
		})
	}
	wg.Wait()
	// Every message not acked is still there and claimable at once: leases
	// claimed but never received were given back.
	is.Equal(int64(count(t, db, `SELECT count(*) FROM transport_messages`)), published.Load()-acked.Load())
	is.Equal(count(t, db, `SELECT count(*) FROM transport_groups WHERE locked_by IS NOT NULL`), 0)
}
