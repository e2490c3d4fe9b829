package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// River (github.com/riverqueue/river) with no-op jobs: what users would pick
// instead. It has no per-group ordering and no exclusivity per key.

type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// riverBench is River migrated into a fresh schema.
type riverBench struct {
	db *pgtest.DB
}

func openRiver(ctx context.Context, workers int) (*riverBench, error) {
	db, err := pgtest.Open(int32(min(workers, 40)) + 8)
	if err != nil {
		return nil, err
	}
	m, err := rivermigrate.New(riverpgxv5.New(db.Pool), &rivermigrate.Config{Schema: db.Schema, Logger: discardLogger()})
	if err != nil {
		_ = db.Drop()
		return nil, err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		_ = db.Drop()
		return nil, fmt.Errorf("river migrate: %w", err)
	}
	return &riverBench{db: db}, nil
}

func (r *riverBench) close() { _ = r.db.Drop() }

// run inserts n jobs in bulk, then works them with workers and returns the
// time from start to the last completion, and the machine's CPU
// microseconds per job in that time. Fetch settings are River's own
// benchmark's (river bench): FetchCooldown 2 ms, FetchPollInterval 20 ms.
func (r *riverBench) run(ctx context.Context, workers, n int) (time.Duration, float64, error) {
	ws := river.NewWorkers()
	river.AddWorker(ws, noopWorker{})
	client, err := river.NewClient(riverpgxv5.New(r.db.Pool), &river.Config{
		Schema:            r.db.Schema,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers:           ws,
		FetchCooldown:     2 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Logger:            discardLogger(),
	})
	if err != nil {
		return 0, 0, err
	}
	if _, err := r.db.Pool.Exec(ctx, `TRUNCATE river_job`); err != nil {
		return 0, 0, err
	}
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{Args: noopArgs{}}
	}
	if _, err := client.InsertManyFast(ctx, params); err != nil {
		return 0, 0, fmt.Errorf("river insert: %w", err)
	}
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{ChanSize: n + 16, Kinds: []river.EventKind{river.EventKindJobCompleted}})
	defer cancel()
	before, start := readCPU(), time.Now()
	if err := client.Start(ctx); err != nil {
		return 0, 0, err
	}
	timeout := time.After(2 * time.Minute)
	for done := 0; done < n; {
		select {
		case <-events:
			done++
		case <-timeout:
			_ = client.Stop(ctx)
			return 0, 0, fmt.Errorf("river: %d of %d jobs completed in 2 minutes", done, n)
		}
	}
	elapsed, after := time.Since(start), readCPU()
	if err := client.Stop(ctx); err != nil {
		return 0, 0, err
	}
	var completed int
	if err := r.db.Pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE state = 'completed'`).Scan(&completed); err != nil {
		return 0, 0, err
	}
	if completed != n {
		return 0, 0, fmt.Errorf("river: %d jobs completed, %d inserted", completed, n)
	}
	cpu, _ := perOp(before, after, int64(n))
	return elapsed, cpu, nil
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
