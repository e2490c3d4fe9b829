package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// The transactional handler (WorkTx) against the plain
// runtime (Work), each handler inserting one row per message into a user
// table, on both front-ends at 16 and 64 handlers, over 10,000 groups:
//   - work-insert: Work, whose handler inserts the row in a commit of its
//     own before the runtime's ack: the effect and the ack are two
//     commits, and a crash between them applies the effect twice;
//   - worktx: WorkTx, whose handler inserts the row in the runtime's
//     transaction, which acks the message and saves the group's state
//     (unchanged here) before its one commit.
//
// WorkTx holds a pool connection for each running handler, so each case
// has a pool of its own sized for its handlers, and only one case's
// connections are open at a time (together they would pass the server's
// max_connections): after its timed run a case's pool closes its
// connections, and before it each case runs once untimed so that its new
// connections are made and their functions compiled outside the timing.
// The cases take turns, one run of each, then the next round.
var (
	workTxConcurrency = []int{16, 64}
	workTxFronts      = []string{"sync", "async"}
)

const workTxGroups = 10_000

func (r *runner) workTx(ctx context.Context) error {
	type txCase struct {
		system string // front + "-work-insert" or "-worktx"
		conc   int
		d      drainer
		db     *pgtest.DB
		res    result
	}
	var cases []*txCase
	defer func() {
		for _, c := range cases {
			c.d.close()
			_ = c.db.Drop()
		}
	}()
	for _, conc := range workTxConcurrency {
		for _, front := range workTxFronts {
			for _, kind := range []string{"-work-insert", "-worktx"} {
				system := front + kind
				db, err := pgtest.Open(int32(conc) + 4) // a connection per handler, the stream's two, the listener's
				if err != nil {
					return err
				}
				d, err := openWorkTx(ctx, system, db)
				if err != nil {
					_ = db.Drop()
					return err
				}
				db.Pool.Reset()
				cases = append(cases, &txCase{system: system, conc: conc, d: d, db: db,
					res: result{suite: "worktx", system: system, workers: conc, groups: workTxGroups, unit: "msgs/s"}})
			}
		}
	}
	once := func(c *txCase) (rate, cpu float64, err error) {
		if _, err := c.db.Pool.Exec(ctx, `TRUNCATE bench_effects`); err != nil {
			return 0, 0, err
		}
		rate, cpu, err = r.drainOnce(ctx, c.d, c.db, c.conc, workTxGroups)
		if err != nil {
			return 0, 0, fmt.Errorf("worktx %s/%d: %w", c.system, c.conc, err)
		}
		return rate, cpu, nil
	}
	for run := range r.s.runs {
		for _, c := range cases {
			r.progress("worktx     %-17s concurrency=%-3d warm-up, then run %d/%d", c.system, c.conc, run+1, r.s.runs)
			if _, _, err := once(c); err != nil {
				return err
			}
			rate, cpu, err := once(c)
			if err != nil {
				return err
			}
			// Each handled message's effect once (the drain's check found
			// every counted message acked).
			var effects, distinct int
			if err := c.db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (group_id, seq)) FROM bench_effects`).Scan(&effects, &distinct); err != nil {
				return err
			}
			if effects == 0 || effects != distinct {
				return fmt.Errorf("worktx %s/%d: %d effect rows for %d messages", c.system, c.conc, effects, distinct)
			}
			c.db.Pool.Reset()
			c.res.runs = append(c.res.runs, rate)
			c.res.addCPU(cpu)
		}
	}
	for _, c := range cases {
		r.add(c.res)
	}
	return nil
}

// effectSQL is the one row each handler writes.
const effectSQL = `INSERT INTO bench_effects (group_id, seq) VALUES ($1, $2)`

// txWorkDrainer runs a transport's WorkTx whose handler inserts the row in
// the runtime's transaction and counts the message.
type txWorkDrainer struct {
	work func(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.TxHandler) error
	stop func()
}

func (d txWorkDrainer) close() { d.stop() }

func (d txWorkDrainer) drain(ctx context.Context, workers int, stop <-chan struct{}, c *checker) error {
	ctx, cancel := stopCtx(ctx, stop, c)
	defer cancel()
	cfg := pgtransport.WorkerConfig{WorkerID: "w", Concurrency: workers, Visibility: time.Minute}
	return d.work(ctx, cfg, func(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease, state []byte) ([]byte, error) {
		if _, err := tx.Exec(ctx, effectSQL, l.Group, l.Seq); err != nil {
			return nil, err
		}
		c.claimed(l.Group, l.Seq)
		c.ack()
		return state, nil
	})
}

// insertWork is a Work whose handler inserts the row (its own commit)
// before the runtime's ack (another).
func insertWork(pool *pgxpool.Pool, work func(context.Context, pgtransport.WorkerConfig, pgtransport.Handler) error) func(context.Context, pgtransport.WorkerConfig, pgtransport.Handler) error {
	return func(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.Handler) error {
		return work(ctx, cfg, func(ctx context.Context, l *pgtransport.Lease) error {
			if _, err := pool.Exec(ctx, effectSQL, l.Group, l.Seq); err != nil {
				return err
			}
			return h(ctx, l)
		})
	}
}

// openWorkTx opens a drainer on system: "sync-work-insert",
// "async-work-insert", "sync-worktx" or "async-worktx", creating the
// effect table.
func openWorkTx(ctx context.Context, system string, db *pgtest.DB) (drainer, error) {
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_effects (id BIGSERIAL PRIMARY KEY, group_id TEXT NOT NULL, seq BIGINT NOT NULL)`); err != nil {
		return nil, err
	}
	cfg := pgtransport.Config{Schema: db.Schema}
	front, kind, _ := strings.Cut(system, "-")
	var (
		work   func(context.Context, pgtransport.WorkerConfig, pgtransport.Handler) error
		workTx func(context.Context, pgtransport.WorkerConfig, pgtransport.TxHandler) error
		stop   func()
	)
	switch front {
	case "sync":
		tr, err := pgsync.New(ctx, db.Pool, cfg)
		if err != nil {
			return nil, err
		}
		work, workTx, stop = tr.Work, tr.WorkTx, tr.Close
	case "async":
		tr, err := async.New(ctx, db.Pool, cfg)
		if err != nil {
			return nil, err
		}
		work, workTx, stop = tr.Work, tr.WorkTx, tr.Close
	default:
		return nil, fmt.Errorf("unknown system %q", system)
	}
	if kind == "worktx" {
		return txWorkDrainer{work: workTx, stop: stop}, nil
	}
	return workDrainer{work: insertWork(db.Pool, work), stop: stop}, nil
}

// workTxTable renders the worktx suite: each figure and WorkTx's ratio to
// Work with the insert, per front-end and concurrency.
func workTxTable(r *runner) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n### The transactional handler (WorkTx) against Work, a row inserted per message (%s groups)\n\n", count(workTxGroups))
	b.WriteString("Measured in turns, each run after an untimed one on the same pool. work-insert: Work, the handler's insert committed before the ack (two commits a message). worktx: WorkTx, the insert, the ack and the group's state in one transaction.\n\n")
	b.WriteString("| system | concurrency | msgs/s | CPU µs/msg | worktx vs work-insert |\n| --- | ---: | ---: | ---: | ---: |\n")
	for _, res := range r.results {
		if res.suite != "worktx" {
			continue
		}
		cmp := "-"
		if front, ok := strings.CutSuffix(res.system, "-worktx"); ok {
			if plain, pok := r.find("worktx", front+"-work-insert", "", res.workers, workTxGroups); pok {
				cmp = ratio(res, plain, true)
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s |\n", res.system, res.workers, figure(res), res.cpuFigure(), cmp)
	}
	return b.String()
}
