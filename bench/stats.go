package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// optIn are the suites the default run leaves out: each takes minutes.
// `go run . -only stats` runs it.
var optIn = map[string]bool{"stats": true}

// The stats suite's queue: 1,000,000 groups and 10,000,000 messages.
const (
	statsGroups   = 1_000_000
	statsMessages = 10_000_000
	statsDead     = 5_000
	statsRuns     = 7
)

// stats times the operator's reads on a large queue built with set-based
// SQL (triggers off: a load of fresh rows, nothing races it): 10 messages
// per group, spread round-robin over the seqs, published over the last
// 10,000 s; priorities 0-4 in turn; 1% of the groups leased (held for up
// to 10 minutes, 1-3 attempts), 1% parked, 0.1% stopped, 0.1% paused, the
// rest free (half never claimed); 5,000 dead letters. Autovacuum is off
// for the tables, so the first pass runs with no statistics at all; the
// second after VACUUM ANALYZE. Each figure: the median and the min-max of
// 7 calls through the blocking transport (one round-trip each).
func (r *runner) stats(ctx context.Context) error {
	db, err := pgtest.Open(4)
	if err != nil {
		return err
	}
	defer func() { _ = db.Drop() }()
	tr, err := pgsync.New(ctx, db.Pool, pgtransport.Config{Schema: db.Schema})
	if err != nil {
		return err
	}
	load := time.Now()
	if err := r.loadStats(ctx, db); err != nil {
		return err
	}
	r.progress("stats      loaded %d groups, %d messages in %s", statsGroups, statsMessages, time.Since(load).Round(time.Second))

	var out strings.Builder
	fmt.Fprintf(&out, "\n### Operator reads at %s groups, %s messages (ms: median [min-max] of %d)\n\n", count(statsGroups), count(statsMessages), statsRuns)
	out.WriteString("| call | no statistics | after VACUUM ANALYZE |\n| --- | ---: | ---: |\n")
	type call struct {
		name string
		call func() error
	}
	var lastStats pgtransport.Stats
	group := fmt.Sprintf("g%d", statsGroups/2+1)
	figures := []call{
		{"Stats", func() error { s, err := tr.Stats(ctx); lastStats = s; return err }},
	}
	for _, o := range []pgtransport.GroupOrder{pgtransport.ByGroup, pgtransport.OldestHead, pgtransport.HeldLongest, pgtransport.MostAttempts} {
		figures = append(figures, call{"Groups " + string(o) + " (50)", func() error {
			gs, err := tr.Groups(ctx, pgtransport.GroupQuery{Order: o, Limit: 50})
			if err == nil && len(gs) != 50 {
				err = fmt.Errorf("groups %s: %d, want 50", o, len(gs))
			}
			return err
		}})
	}
	figures = append(figures,
		call{"Groups state=paused (50)", func() error {
			gs, err := tr.Groups(ctx, pgtransport.GroupQuery{State: pgtransport.GroupPaused, Limit: 50})
			if err == nil && len(gs) != 50 {
				err = fmt.Errorf("paused groups: %d, want 50", len(gs))
			}
			return err
		}},
		call{"Group", func() error { _, err := tr.Group(ctx, group); return err }},
		call{"Peek (10)", func() error {
			ms, err := tr.Peek(ctx, group, 10)
			if err == nil && len(ms) != 10 {
				err = fmt.Errorf("peek: %d, want 10", len(ms))
			}
			return err
		}},
	)
	cells := make([][2]string, len(figures))
	var statsSeen [2]pgtransport.Stats
	for pass := range 2 {
		if pass == 1 {
			start := time.Now()
			for _, table := range []string{"transport_groups", "transport_messages", "transport_dead_letters"} {
				if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE `+table); err != nil {
					return err
				}
			}
			r.progress("stats      VACUUM ANALYZE took %s", time.Since(start).Round(100*time.Millisecond))
		}
		for i, f := range figures {
			res := result{suite: "stats", system: "sync", variant: f.name + []string{" (no statistics)", " (analyzed)"}[pass], groups: statsGroups, workers: 1, unit: "ms"}
			for range statsRuns {
				start := time.Now()
				if err := f.call(); err != nil {
					return fmt.Errorf("%s: %w", f.name, err)
				}
				res.runs = append(res.runs, ms(time.Since(start)))
			}
			r.progress("stats      %-28s %s", res.variant, figureOf(res))
			cells[i][pass] = figureOf(res)
			r.add(res)
		}
		statsSeen[pass] = lastStats
	}
	for i, f := range figures {
		fmt.Fprintf(&out, "| %s | %s | %s |\n", f.name, cells[i][0], cells[i][1])
	}
	out.WriteString("\nWhat Stats answered (no statistics / analyzed):\n\n")
	for pass, s := range statsSeen {
		t := s.Total
		fmt.Fprintf(&out, "- %s: groups %d (free %d, leased %d, parked %d, stopped %d, paused %d); messages %d (exact %t); oldest head %.1f s (exact %t); dead letters %d (exact %t)\n",
			[]string{"no statistics", "analyzed"}[pass], t.Groups, t.Free, t.Leased, t.Parked, t.Stopped, t.Paused,
			t.Messages, t.MessagesExact, t.OldestHeadAge.Seconds(), t.OldestHeadExact, t.DeadLetters, t.DeadLettersExact)
		var per []string
		for _, p := range s.ByPriority {
			per = append(per, fmt.Sprintf("p%d %d msgs, oldest %.0f s (exact %t)", p.Priority, p.Messages, p.OldestHeadAge.Seconds(), p.OldestHeadExact))
		}
		fmt.Fprintf(&out, "  %s\n", strings.Join(per, "; "))
	}
	fmt.Fprintf(&out, "- the truth: messages %d, dead letters %d, oldest head 10,000 s\n", statsMessages, statsDead)
	fmt.Print(out.String())
	return nil
}

// loadStats fills db's queue with the stats suite's rows.
func (r *runner) loadStats(ctx context.Context, db *pgtest.DB) error {
	for _, table := range []string{"transport_groups", "transport_messages", "transport_dead_letters"} {
		if _, err := db.Pool.Exec(ctx, `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`); err != nil {
			return err
		}
	}
	const chunk = 1_000_000
	// Message j (1-based) is group (j-1) % groups' (j-1)/groups-th: group
	// i's head is seq i+1. published_at: 1 ms apart, the oldest 10,000 s
	// ago.
	for from := 1; from <= statsMessages; from += chunk {
		r.progress("stats      loading messages %d-%d", from, from+chunk-1)
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `
				INSERT INTO transport_messages (seq, group_id, event, published_at)
				SELECT j, 'g' || ((j - 1) % $3 + 1), 'event ' || j,
				       now() - interval '10000 s' + (j - 1) * interval '1 ms'
				  FROM generate_series($1::bigint, $2::bigint) AS j`, from, from+chunk-1, statsGroups)
			return err
		})
		if err != nil {
			return err
		}
	}
	r.progress("stats      loading groups and dead letters")
	return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		for _, q := range []string{
			`SET LOCAL session_replication_role = replica`,
			`SELECT setval(pg_get_serial_sequence('transport_messages', 'seq'), ` + fmt.Sprint(statsMessages+statsDead) + `)`,
			// i % 100 = 1 leased, 2 parked; i % 1000 = 3 stopped, 4
			// paused; the rest free, odd ones freed once, even ones never
			// claimed.
			`INSERT INTO transport_groups (group_id, priority, locked_by, lock_expiry, leased_at, delivered_seq, attempts, paused)
			 SELECT 'g' || i, i % 5,
			        CASE WHEN i % 100 = 1 THEN 'w:bench' || i
			             WHEN i % 100 = 2 OR i % 1000 = 3 THEN ''
			             WHEN i % 2 = 1 THEN NULL END,
			        CASE WHEN i % 100 = 1 THEN e + 3600 - i % 600
			             WHEN i % 100 = 2 THEN e + 3600
			             WHEN i % 1000 = 3 THEN 'Infinity'
			             WHEN i % 2 = 1 THEN e - 60 END,
			        CASE WHEN i % 100 = 1 THEN e - i % 600 END,
			        CASE WHEN i % 100 IN (1, 2) OR i % 1000 = 3 THEN i END,
			        CASE WHEN i % 100 = 1 THEN 1 + i % 3 WHEN i % 100 = 2 THEN 2 WHEN i % 1000 = 3 THEN 5 ELSE 0 END,
			        i % 1000 = 4
			   FROM generate_series(1, ` + fmt.Sprint(statsGroups) + `) AS i,
			        (SELECT extract(epoch FROM now())::float8 AS e) AS t`,
			`INSERT INTO transport_dead_letters (seq, group_id, event, priority, attempts, last_error, published_at)
			 SELECT ` + fmt.Sprint(statsMessages) + ` + k, 'g' || k, 'dead ' || k, k % 5, 10, 'boom', now() - interval '1 day'
			   FROM generate_series(1, ` + fmt.Sprint(statsDead) + `) AS k`,
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("%.60s: %w", strings.TrimSpace(q), err)
			}
		}
		return nil
	})
}

// figureOf is a result's median and spread in ms.
func figureOf(res result) string {
	runs := slices.Sorted(slices.Values(res.runs))
	return fmt.Sprintf("%.1f [%.1f-%.1f]", runs[len(runs)/2], runs[0], runs[len(runs)-1])
}
