package async_test

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/internal/testkit/contract"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// TestContractPgBouncer is sync's TestContractPgBouncer for the async
// Transport, pgx in exec mode, behind a transaction pooler and so without
// notifications (poll-only).
func TestContractPgBouncer(t *testing.T) {
	b := pgtest.Bouncer(t)
	contract.Run(t, contract.Opener{DB: func(t *testing.T, db core.DBTX, cfg pgtransport.Config) (contract.Transport, error) {
		bouncerSkip(t)
		pool := db.(*pgxpool.Pool)
		cfg.Logger = slog.New(slog.DiscardHandler) // "notifications are off", once per transport
		tr, err := async.New(ctx(t), b.Reroute(t, pool, "exec"), cfg)
		if err != nil {
			return nil, err
		}
		t.Cleanup(tr.Close)
		return blocking{tr}, nil
	}}) // one database: PgBouncer stands in front of one
}

// bouncerSkips: as sync's, the cases TestContract runs alone.
var bouncerSkips = []string{"LostPublishRace", "LostPublishRaceBatchAck", "RedriveRacesPublishAndDrain"}

func bouncerSkip(t *testing.T) {
	t.Helper()
	if slices.Contains(bouncerSkips, path.Base(t.Name())) {
		t.Skip("a server-side race repeated thousands of times: TestContract runs it")
	}
}

// TestPoolerExecModeRefused: New and FromDSN through a transaction pooler
// refuse pgx's default mode.
func TestPoolerExecModeRefused(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	b := pgtest.Bouncer(t)
	db := pgtest.New(t, 2)
	_, err := async.New(ctx(t), b.Pool(t, 2, "", ""), pgtransport.Config{Schema: db.Schema})
	is.True(errors.Is(err, pgtransport.ErrPoolerExecMode)) // New
	_, err = async.FromDSN(ctx(t), b.DSN("describe_exec"), pgtransport.Config{Schema: db.Schema})
	is.True(errors.Is(err, pgtransport.ErrPoolerExecMode)) // FromDSN
}

// wakeups publishes rounds messages, one at a time, through pub (another
// Transport: no in-process wake-up), each once s has gone idle, and
// returns how long each took to reach s, sorted.
func wakeups(t *testing.T, tr *async.Transport, s *async.Stream, pub *pgsync.Transport, rounds int) []time.Duration {
	t.Helper()
	var took []time.Duration
	for i := range rounds {
		// kept: lets the stream settle the last ack and fall asleep, and
		// puts the publish at a random point of its IdleSweep.
		time.Sleep(100*time.Millisecond + rand.N(200*time.Millisecond))
		start := time.Now()
		if _, err := pub.Publish(ctx(t), fmt.Sprint("g", i), "e", 0); err != nil {
			t.Fatalf("publish: %v", err)
		}
		l := receive(t, s, 30*time.Second)
		took = append(took, time.Since(start))
		if err := <-tr.Ack(ctx(t), l); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	slices.Sort(took)
	return took
}

// TestPollOnlyThroughPgBouncer: behind a transaction pooler with no
// ListenDSN, the Transport logs once, however many streams it runs, that
// notifications are off; its streams say they poll, their Ready never
// closes, and they still find work another process publishes, within
// IdleSweep.
func TestPollOnlyThroughPgBouncer(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	b := pgtest.Bouncer(t)
	db := pgtest.New(t, 2)
	logs := &pgtest.Logs{Level: slog.LevelInfo}
	const sweep = time.Second // the default
	tr := open(t, b.Pool(t, 8, "cache_describe", ""), pgtransport.Config{Schema: db.Schema, Logger: logs.Logger()})
	off := logs.Find(slog.LevelWarn, "notifications are off")
	is.Equal(len(off), 1) // said once, at open
	s, err := tr.Stream(ctx(t), async.StreamConfig{WorkerID: "w", Visibility: time.Minute})
	is.NoErr(err)
	t.Cleanup(s.Close)
	is.True(s.PollOnly()) // no notification can arrive
	s2, err := tr.Stream(ctx(t), async.StreamConfig{WorkerID: "w2", Visibility: time.Minute})
	is.NoErr(err)
	s2.Close()
	pub, err := pgsync.New(ctx(t), b.Pool(t, 2, "exec", ""), pgtransport.Config{Schema: db.Schema})
	is.NoErr(err)
	took := wakeups(t, tr, s, pub, 6)
	t.Logf("poll-only through pgbouncer: pickup p50 %v, max %v (IdleSweep %v)", took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), sweep)
	is.True(took[len(took)-1] < sweep+2*time.Second) // found by the sweep
	select {
	case <-s.Ready():
		t.Fatal("Ready closed, though no notification can arrive")
	default:
	}
	is.Equal(len(logs.Find(slog.LevelWarn, "notifications are off")), 1) // still once
}

// TestListenDSNThroughPgBouncer: with a ListenDSN straight to PostgreSQL,
// a Transport whose pool goes through a transaction pooler listens there:
// Ready closes, and work another process publishes through the pooler
// wakes the stream at once, long before IdleSweep.
func TestListenDSNThroughPgBouncer(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	b := pgtest.Bouncer(t)
	db := pgtest.New(t, 2)
	logs := &pgtest.Logs{Level: slog.LevelInfo}
	const sweep = 10 * time.Second // so that no sweep explains a prompt pickup
	tr := open(t, b.Pool(t, 8, "cache_describe", ""), pgtransport.Config{Schema: db.Schema, Logger: logs.Logger(), IdleSweep: sweep, Async: pgtransport.AsyncConfig{ListenDSN: db.DSN}})
	is.Equal(len(logs.Find(slog.LevelWarn, "notifications are off")), 0)
	s := stream(t, tr, async.StreamConfig{}) // waits for Ready
	is.True(!s.PollOnly())
	pub, err := pgsync.New(ctx(t), b.Pool(t, 2, "exec", ""), pgtransport.Config{Schema: db.Schema})
	is.NoErr(err)
	took := wakeups(t, tr, s, pub, 10)
	t.Logf("ListenDSN, pool through pgbouncer: pickup p50 %v, max %v (IdleSweep %v)", took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), sweep)
	is.True(took[len(took)-1] < sweep/2) // woken, not swept
}

// TestListenDSNThroughPoolerRefused: a ListenDSN that goes through a
// pooler too is refused at each connect, and logged; Ready stays open,
// and the stream still finds work by its sweep.
func TestListenDSNThroughPoolerRefused(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	b := pgtest.Bouncer(t)
	db := pgtest.New(t, 2)
	logs := &pgtest.Logs{Level: slog.LevelInfo}
	tr := open(t, b.Pool(t, 8, "exec", ""), pgtransport.Config{Schema: db.Schema, Logger: logs.Logger(), IdleSweep: 200 * time.Millisecond, Async: pgtransport.AsyncConfig{ListenDSN: b.DSN("exec")}})
	s, err := tr.Stream(ctx(t), async.StreamConfig{WorkerID: "w", Visibility: time.Minute})
	is.NoErr(err)
	t.Cleanup(s.Close)
	eventually(t, 30*time.Second, "the refused listener logged", func() bool {
		return len(logs.Find(slog.LevelWarn, "listener connection failed")) > 0
	})
	v, _ := pgtest.Attr(logs.Find(slog.LevelWarn, "listener connection failed")[0], "error")
	is.True(strings.Contains(v.String(), "pooler")) // the reason: it goes through a pooler
	is.NoErr((<-tr.Publish(ctx(t), "g", "e", 0)).Err)
	is.Equal(receive(t, s, 30*time.Second).Group, "g") // swept
	select {
	case <-s.Ready():
		t.Fatal("Ready closed, though the listener never listened")
	default:
	}
}
