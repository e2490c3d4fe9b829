package sync_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/internal/testkit/workertest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// TestWork runs the runtime's cases against the blocking Transport's Work.
func TestWork(t *testing.T) {
	workertest.Run(t, func(t *testing.T, pool *pgxpool.Pool, cfg pgtransport.Config) workertest.Worker {
		tr, err := pgsync.New(context.Background(), pool, cfg)
		if err != nil {
			t.Fatalf("new: %v", err)
		}
		t.Cleanup(tr.Close)
		return tr
	}, "github.com/pgtransport/pgtransport/sync")
}

// TestWorkReturnsWhenAStepHangs: a slot whose ack-and-claim step gets no
// reply (a server that hangs after the commit) holds Work's shutdown for
// ShutdownTimeout and pgtransport.AbandonTimeout at most, not for the
// step's own 30 s bound: Work returns without the slot, once its
// combiner has cut the step short (its close waits for its senders).
func TestWorkReturnsWhenAStepHangs(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	p := pgtest.NewProxy(t)
	tr, err := pgsync.New(context.Background(), p.Pool(t, db, 4), pgtransport.Config{Schema: db.Schema})
	is.NoErr(err)
	defer tr.Close()
	_, err = tr.Publish(pgtest.Context(t), "held-step", "x", 0)
	is.NoErr(err)
	p.HoldAfterCommit("held-step") // the ack step names the group; the claims before it do not

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- tr.Work(ctx, pgtransport.WorkerConfig{Concurrency: 1, ShutdownTimeout: 100 * time.Millisecond},
			func(context.Context, *pgtransport.Lease) error { return nil })
	}()
	for deadline := time.Now().Add(20 * time.Second); p.Lost() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the ack step never reached the server")
		}
	}
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		is.NoErr(err)
	case <-time.After(25 * time.Second):
		t.Fatal("Work did not return within 25 s of its ctx's end")
	}
	took := time.Since(start)
	t.Logf("Work returned %v after its ctx ended", took.Round(time.Millisecond))
	is.True(took < pgtransport.AbandonTimeout+10*time.Second) // bounded by the shutdown's timeouts, not the step's 30 s
}
