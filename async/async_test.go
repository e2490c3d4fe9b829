package async_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

func TestMain(m *testing.M) {
	pgtest.MainWithExamples(m,
		"github.com/pgtransport/pgtransport/async",
		"github.com/pgtransport/pgtransport/internal/cluster", // ClaimWait's waits over partitions
		"github.com/pgtransport/pgtransport/internal/core",
		"github.com/pgtransport/pgtransport/notify",
		"github.com/jackc/pgxlisten")
}

func ctx(tb testing.TB) context.Context { return pgtest.Context(tb) }

func open(t *testing.T, db core.DBTX, cfg pgtransport.Config) *async.Transport {
	t.Helper()
	tr, err := async.New(context.Background(), db.(*pgxpool.Pool), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(tr.Close)
	return tr
}

// TestMirrorsSync: every method of the blocking Transport exists on the
// async one with the same name and arguments; its results come instead on a
// channel: (T, error) as <-chan Result[T], error as <-chan error.
func TestMirrorsSync(t *testing.T) {
	is := is.New(t)
	st := reflect.TypeFor[*pgsync.Transport]()
	at := reflect.TypeFor[*async.Transport]()
	errType := reflect.TypeFor[error]()
	extra := map[string]bool{"Stream": true}                                      // async only
	local := map[string]bool{"Partitions": true, "Home": true, "Partition": true} // answered without a round-trip
	for i := range st.NumMethod() {
		sm := st.Method(i)
		am, ok := at.MethodByName(sm.Name)
		if !ok {
			t.Errorf("async.Transport lacks %s", sm.Name)
			continue
		}
		is.Equal(am.Type.NumIn(), sm.Type.NumIn()) // same arguments
		for j := 1; j < sm.Type.NumIn(); j++ {
			is.Equal(am.Type.In(j), sm.Type.In(j)) // same argument types
		}
		var want []reflect.Type
		switch {
		case local[sm.Name]: // no round-trip: the same results (a pool where sync has its DBTX)
			is.Equal(am.Type.NumOut(), sm.Type.NumOut())
			for j := range sm.Type.NumOut() {
				if o := am.Type.Out(j); o != sm.Type.Out(j) && !(sm.Type.Out(j).Kind() == reflect.Interface && o.Implements(sm.Type.Out(j))) {
					t.Errorf("%s returns %v, want %v", sm.Name, o, sm.Type.Out(j))
				}
			}
			continue
		case sm.Name == "Work" || sm.Name == "WorkTx": // the runtime blocks in both: its result is the end of the run
			want = []reflect.Type{errType}
		case sm.Type.NumOut() == 0: // Close
		case sm.Type.NumOut() == 1:
			is.Equal(sm.Type.Out(0), errType)
			want = []reflect.Type{reflect.TypeFor[<-chan error]()}
		case sm.Type.NumOut() == 2:
			is.Equal(sm.Type.Out(1), errType)
			r, ok := resultType(sm.Type.Out(0))
			if !ok {
				t.Fatalf("no async.Result for %v", sm.Type.Out(0))
			}
			want = []reflect.Type{reflect.ChanOf(reflect.RecvDir, r)}
		}
		is.Equal(am.Type.NumOut(), len(want))
		for j, w := range want {
			if am.Type.Out(j) != w {
				t.Errorf("%s returns %v, want %v", sm.Name, am.Type.Out(j), w)
			}
		}
	}
	for i := range at.NumMethod() {
		if name := at.Method(i).Name; !extra[name] {
			_, ok := st.MethodByName(name)
			is.True(ok) // no async-only method besides the listed extras
		}
	}
}

func resultType(v reflect.Type) (reflect.Type, bool) {
	switch v {
	case reflect.TypeFor[int64]():
		return reflect.TypeFor[async.Result[int64]](), true
	case reflect.TypeFor[*pgtransport.Lease]():
		return reflect.TypeFor[async.Result[*pgtransport.Lease]](), true
	case reflect.TypeFor[[]int64]():
		return reflect.TypeFor[async.Result[[]int64]](), true
	case reflect.TypeFor[[]*pgtransport.Lease]():
		return reflect.TypeFor[async.Result[[]*pgtransport.Lease]](), true
	case reflect.TypeFor[[]error]():
		return reflect.TypeFor[async.Result[[]error]](), true
	case reflect.TypeFor[[]pgtransport.DeadLetter]():
		return reflect.TypeFor[async.Result[[]pgtransport.DeadLetter]](), true
	case reflect.TypeFor[pgtransport.Stats]():
		return reflect.TypeFor[async.Result[pgtransport.Stats]](), true
	case reflect.TypeFor[pgtransport.Policy]():
		return reflect.TypeFor[async.Result[pgtransport.Policy]](), true
	case reflect.TypeFor[int]():
		return reflect.TypeFor[async.Result[int]](), true
	case reflect.TypeFor[pgtransport.GroupInfo]():
		return reflect.TypeFor[async.Result[pgtransport.GroupInfo]](), true
	case reflect.TypeFor[[]pgtransport.GroupInfo]():
		return reflect.TypeFor[async.Result[[]pgtransport.GroupInfo]](), true
	case reflect.TypeFor[[]pgtransport.PeekedMessage]():
		return reflect.TypeFor[async.Result[[]pgtransport.PeekedMessage]](), true
	case reflect.TypeFor[[]pgtransport.TenantInfo]():
		return reflect.TypeFor[async.Result[[]pgtransport.TenantInfo]](), true
	case reflect.TypeFor[[]byte]():
		return reflect.TypeFor[async.Result[[]byte]](), true
	}
	return nil, false
}

// setup returns an async transport on a fresh schema with cfg (Schema
// filled in), a blocking one beside it, and the schema's handle.
func setup(t *testing.T, cfg pgtransport.Config) (*async.Transport, *pgsync.Transport, *pgtest.DB) {
	t.Helper()
	db := pgtest.New(t, 16)
	cfg.Schema = db.Schema
	tr := open(t, db.Pool, cfg)
	cfg.Async = pgtransport.AsyncConfig{} // the blocking transport refuses what it cannot honour
	st, err := pgsync.New(ctx(t), db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr, st, db
}

func stream(t *testing.T, tr *async.Transport, cfg async.StreamConfig) *async.Stream {
	t.Helper()
	cfg.WorkerID = "w"
	if cfg.Visibility == 0 {
		cfg.Visibility = time.Minute
	}
	s, err := tr.Stream(ctx(t), cfg)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	t.Cleanup(s.Close)
	select {
	case <-s.Ready():
	case <-time.After(time.Minute):
		t.Fatal("stream never ready")
	}
	return s
}

func receive(t *testing.T, s *async.Stream, within time.Duration) *pgtransport.Lease {
	t.Helper()
	select {
	case l, ok := <-s.C():
		if !ok {
			t.Fatalf("stream closed: %v", s.Err())
		}
		return l
	case <-time.After(within):
		t.Fatalf("no lease within %v", within)
		return nil
	}
}

// eventually polls cond until it holds, and fails the test if it does not
// within the given time. It is for conditions only the database shows (a
// row, a statistic), which no channel signals.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never %s within %v", what, within)
		}
	}
}

func count(t *testing.T, db *pgtest.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(ctx(t), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// TestStreamDrains: a stream holding up to 8 leases drains 40 groups, each
// in publish order, while its receiver acks from many goroutines.
func TestStreamDrains(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, db := setup(t, pgtransport.Config{})
	const groups, per = 40, 10
	for i := range per {
		for g := range groups {
			r := <-tr.Publish(ctx(t), fmt.Sprint("g", g), fmt.Sprint(i), 0)
			is.NoErr(r.Err)
		}
	}
	s := stream(t, tr, async.StreamConfig{MaxInFlight: 8})
	var (
		mu   stdsync.Mutex
		next = map[string]int{}
		wg   stdsync.WaitGroup
	)
	for range groups * per {
		l := receive(t, s, time.Minute)
		mu.Lock()
		if want := fmt.Sprint(next[l.Group]); l.Event != want {
			t.Errorf("group %s: got event %s, want %s", l.Group, l.Event, want)
		}
		next[l.Group]++
		mu.Unlock()
		wg.Go(func() { is.NoErr(<-tr.Ack(ctx(t), l)) })
	}
	wg.Wait()
	is.Equal(count(t, db, `SELECT count(*) FROM transport_messages`), 0)
	is.Equal(count(t, db, `SELECT count(*) FROM transport_groups WHERE drained_at IS NULL`), 0)
}

// TestBackPressure: the stream never holds more than MaxInFlight leases,
// counting the one waiting to be received, and claims again as they settle.
func TestBackPressure(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, db := setup(t, pgtransport.Config{})
	for g := range 10 {
		is.NoErr((<-tr.Publish(ctx(t), fmt.Sprint("g", g), "e", 0)).Err)
	}
	s := stream(t, tr, async.StreamConfig{MaxInFlight: 3})
	held := []*pgtransport.Lease{receive(t, s, time.Minute), receive(t, s, time.Minute)}
	locked := func() int { return count(t, db, `SELECT count(*) FROM transport_groups WHERE locked_by IS NOT NULL`) }
	// The third is claimed and waits to be received; no fourth is claimed.
	eventually(t, time.Minute, "3 leases held", func() bool { return locked() >= 3 })
	// Kept sleeps: they show that something does not happen, and a full
	// stream signals nothing when it declines to claim; a wrong fourth claim
	// would follow the third within a round-trip, well inside 200 ms.
	time.Sleep(200 * time.Millisecond)
	is.Equal(locked(), 3)
	held = append(held, receive(t, s, time.Minute))
	time.Sleep(200 * time.Millisecond)
	is.Equal(locked(), 3) // three received, none settled: nothing more
	is.NoErr(<-tr.Ack(ctx(t), held[0]))
	is.True(receive(t, s, time.Minute) != nil) // a settled lease frees a slot
}

// TestBackPressureWhileBusy: with acks streaming in, and so two round-trips
// in flight at times, the leases the database shows held never exceed
// MaxInFlight, and nothing is handed out twice or out of order.
func TestBackPressureWhileBusy(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, st, db := setup(t, pgtransport.Config{})
	const groups, per, limit = 300, 3, 8
	msgs := make([]pgtransport.Message, 0, groups*per)
	for i := range per {
		for g := range groups {
			msgs = append(msgs, pgtransport.Message{Group: fmt.Sprint("g", g), Event: fmt.Sprint(i)})
		}
	}
	_, err := st.PublishMany(ctx(t), msgs)
	is.NoErr(err)
	var (
		most, held int
		sampleErr  error
		stop       = make(chan struct{})
		sampled    = make(chan struct{})
	)
	go func() { // sample what the database shows held until the drain ends
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			sampleErr = db.Pool.QueryRow(ctx(t), `SELECT count(*) FROM transport_groups WHERE locked_by IS NOT NULL`).Scan(&held)
			if sampleErr != nil {
				return
			}
			most = max(most, held)
		}
	}()
	s := stream(t, tr, async.StreamConfig{MaxInFlight: limit})
	next := map[string]int{}
	var wg stdsync.WaitGroup
	for range groups * per {
		l := receive(t, s, time.Minute)
		if want := fmt.Sprint(next[l.Group]); l.Event != want {
			t.Errorf("group %s: got event %s, want %s", l.Group, l.Event, want)
		}
		next[l.Group]++
		wg.Go(func() { is.NoErr(<-tr.Ack(ctx(t), l)) })
	}
	wg.Wait()
	close(stop)
	<-sampled
	is.NoErr(sampleErr)
	is.True(most > 0)      // the sampler saw the stream at work
	is.True(most <= limit) // and never more leases than MaxInFlight
	is.Equal(count(t, db, `SELECT count(*) FROM transport_messages`), 0)
}

// TestAckTwice: a second ack of a stream's lease, while the first is on its
// way or after it kept the group for its next message under the same
// token, is refused with ErrLeaseLost and changes nothing: the group stays
// with the holder of the next message.
func TestAckTwice(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, st, _ := setup(t, pgtransport.Config{})
	for _, e := range []string{"e1", "e2", "e3"} {
		is.NoErr((<-tr.Publish(ctx(t), "g", e, 0)).Err)
	}
	s := stream(t, tr, async.StreamConfig{})
	first := receive(t, s, time.Minute)
	is.Equal(first.Event, "e1")
	a, b := tr.Ack(ctx(t), first), tr.Ack(ctx(t), first) // the second while the first is queued
	is.NoErr(<-a)
	is.True(errors.Is(<-b, pgtransport.ErrLeaseLost))
	next := receive(t, s, time.Minute)
	is.Equal(next.Event, "e2")                                            // kept: the same group, the same token
	is.Equal(next.Token, first.Token)                                     // so only the seq tells the leases apart
	is.True(errors.Is(<-tr.Ack(ctx(t), first), pgtransport.ErrLeaseLost)) // stale
	other, err := st.Claim(ctx(t), "other", time.Minute, 0)
	is.NoErr(err)
	is.True(other == nil) // the group is still held for e2
	is.NoErr(<-tr.Ack(ctx(t), next))
	is.Equal(receive(t, s, time.Minute).Event, "e3")
}

// TestCloseGivesBack: closing a stream hands back the lease it claimed but
// never delivered, at once, and closes the channel.
func TestCloseGivesBack(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, st, db := setup(t, pgtransport.Config{})
	is.NoErr((<-tr.Publish(ctx(t), "g", "e", 0)).Err)
	s := stream(t, tr, async.StreamConfig{})
	// The stream has claimed, nobody receives: only the table shows it.
	eventually(t, time.Minute, "claimed", func() bool {
		return count(t, db, `SELECT count(*) FROM transport_groups WHERE locked_by IS NOT NULL`) > 0
	})
	s.Close()
	s.Close() // twice is fine
	_, ok := <-s.C()
	is.True(!ok)                                             // closed by its sender
	is.True(errors.Is(s.Err(), pgtransport.ErrStreamClosed)) // the stream's own Close, and it says so
	is.Equal(s.Err().Error(), "pgtransport: stream closed")  // not "transport closed": the Transport is open
	is.True(errors.Is(s.Err(), pgtransport.ErrClosed))       // what a check for ErrClosed still finds
	l, err := st.Claim(ctx(t), "other", time.Minute, 0)
	is.NoErr(err)
	is.True(l != nil) // claimable now, not after a minute's visibility
	is.Equal(l.Event, "e")
	is.Equal(count(t, db, `SELECT count(*) FROM transport_waiters`), 0) // the stream withdrew its waiter row
}

// TestUnreceivedLeaseIsGivenBack: a lease nobody receives is handed back
// before its visibility can run out, and never lapses in the stream.
func TestUnreceivedLeaseIsGivenBack(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, db := setup(t, pgtransport.Config{})
	is.NoErr((<-tr.Publish(ctx(t), "g", "e", 0)).Err)
	s := stream(t, tr, async.StreamConfig{Visibility: pgtransport.MinVisibility})
	seen := map[string]bool{}
	deadline := time.Now().Add(5 * pgtransport.MinVisibility / 2)
	for time.Now().Before(deadline) {
		var token string
		var lapsed bool
		err := db.Pool.QueryRow(ctx(t), `SELECT COALESCE(locked_by, ''), COALESCE(lock_expiry < extract(epoch FROM clock_timestamp()), false) FROM transport_groups`).Scan(&token, &lapsed)
		is.NoErr(err)
		is.True(!(token != "" && lapsed)) // never a lease past its expiry
		if token != "" {
			seen[token] = true
		}
		// Kept: the test samples the lease over real time, as the stream's
		// own timer hands it back before the server-side expiry.
		time.Sleep(10 * time.Millisecond)
	}
	is.True(len(seen) >= 2)                         // given back and claimed afresh, not held on
	is.Equal(receive(t, s, time.Minute).Event, "e") // and still there for the receiver
}

// TestCancel: ctx's end stops the stream, and Err says so.
func TestCancel(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, _ := setup(t, pgtransport.Config{})
	c, cancel := context.WithCancel(context.Background())
	s, err := tr.Stream(c, async.StreamConfig{WorkerID: "w", Visibility: time.Minute})
	is.NoErr(err)
	cancel()
	for range s.C() {
	}
	is.True(errors.Is(s.Err(), context.Canceled))
}

// TestClosed: after Close every call delivers ErrClosed and writes nothing.
func TestClosed(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, db := setup(t, pgtransport.Config{})
	s := stream(t, tr, async.StreamConfig{})
	tr.Close()
	tr.Close() // twice is fine
	_, ok := <-s.C()
	is.True(!ok)
	is.True(errors.Is(s.Err(), pgtransport.ErrClosed))        // the Transport's Close
	is.True(!errors.Is(s.Err(), pgtransport.ErrStreamClosed)) // not the stream's own
	is.True(errors.Is((<-tr.Publish(ctx(t), "g", "e", 0)).Err, pgtransport.ErrClosed))
	is.True(errors.Is((<-tr.Claim(ctx(t), "w", time.Minute, 0)).Err, pgtransport.ErrClosed))
	is.True(errors.Is(<-tr.Ack(ctx(t), &pgtransport.Lease{Group: "g", Token: "t"}), pgtransport.ErrClosed))
	_, err := tr.Stream(ctx(t), async.StreamConfig{WorkerID: "w", Visibility: time.Minute})
	is.True(errors.Is(err, pgtransport.ErrClosed))
	is.Equal(count(t, db, `SELECT count(*) FROM transport_messages`), 0)
}

// TestStreamConfigZeroWorks: a StreamConfig's zero value works, with a
// WorkerConfig's defaults: the leases' tokens start with hostname:pid and
// they hold for DefaultWorkerVisibility.
func TestStreamConfigZeroWorks(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, _ := setup(t, pgtransport.Config{})
	s, err := tr.Stream(ctx(t), async.StreamConfig{})
	is.NoErr(err) // zero works
	defer s.Close()
	sent := time.Now()
	is.NoErr((<-tr.Publish(ctx(t), "g", "e", 0)).Err)
	l := receive(t, s, 10*time.Second)
	host, _ := os.Hostname()
	is.True(strings.HasPrefix(l.Token, fmt.Sprintf("%s:%d:", host, os.Getpid()))) // the default worker id
	left := time.Until(l.Expiry)
	is.True(left > pgtransport.DefaultWorkerVisibility-time.Since(sent)-time.Second && left <= pgtransport.DefaultWorkerVisibility) // the default visibility
	is.NoErr(<-tr.Ack(ctx(t), l))
}

func TestStreamConfigErrors(t *testing.T) {
	t.Parallel()
	tr, _, _ := setup(t, pgtransport.Config{})
	for _, tc := range []struct {
		name string
		cfg  async.StreamConfig
		want error
	}{
		{"NULInWorkerID", async.StreamConfig{WorkerID: "w\x00", Visibility: time.Minute}, pgtransport.ErrInvalidWorkerID},
		{"NegativeVisibility", async.StreamConfig{WorkerID: "w", Visibility: -time.Second}, pgtransport.ErrInvalidVisibility},
		{"PriorityFloorTooHigh", async.StreamConfig{WorkerID: "w", Visibility: time.Minute, MinPriority: 5}, pgtransport.ErrInvalidPriority},
		{"NegativeInFlightBound", async.StreamConfig{WorkerID: "w", Visibility: time.Minute, MaxInFlight: -1}, pgtransport.ErrInvalidConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tr.Stream(ctx(t), tc.cfg)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// TestFromDSN: a Transport from a DSN owns its pool and works end to end.
func TestFromDSN(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	tr, err := async.FromDSN(ctx(t), db.DSN, pgtransport.Config{Schema: db.Schema})
	is.NoErr(err)
	defer tr.Close()
	s := stream(t, tr, async.StreamConfig{})
	is.NoErr((<-tr.Publish(ctx(t), "g", "e", 0)).Err)
	l := receive(t, s, 10*time.Second)
	is.Equal(l.Event, "e")
	is.NoErr(<-tr.Ack(ctx(t), l))

	_, err = async.FromDSN(ctx(t), "postgres://%zz", pgtransport.Config{})
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // a malformed DSN fails at once
	_, err = async.New(ctx(t), nil, pgtransport.Config{})
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig))
}

// TestVacuum: with Config.Async.Vacuum the transport vacuums the queue tables
// once they collect dead rows (this repository's CI server runs with
// autovacuum off, so nothing else would).
func TestVacuum(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 8)
	tr := open(t, db.Pool, pgtransport.Config{Schema: db.Schema, Async: pgtransport.AsyncConfig{Vacuum: 50 * time.Millisecond}})
	msgs := make([]pgtransport.Message, 3000)
	for i := range msgs {
		msgs[i] = pgtransport.Message{Group: fmt.Sprint("g", i), Event: "e"}
	}
	is.NoErr((<-tr.PublishMany(ctx(t), msgs)).Err)
	for range 3 { // claim and ack everything: dead rows in both tables
		ls := (<-tr.ClaimMany(ctx(t), "w", time.Minute, 0, 1000)).Value
		errs := (<-tr.AckMany(ctx(t), ls)).Value
		is.Equal(len(errs), 1000)
	}
	eventually(t, 30*time.Second, "vacuumed transport_groups", func() bool {
		var vacuums int
		is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT vacuum_count + autovacuum_count FROM pg_stat_user_tables WHERE relid = 'transport_groups'::regclass`).Scan(&vacuums))
		return vacuums > 0
	})
}
