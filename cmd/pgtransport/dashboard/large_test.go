package dashboard

import (
	"context"
	"flag"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

var large = flag.Int("large", 0, "time every page on a queue of this many groups (3 messages each), e.g. -large=1000000; takes minutes")

// TestLargeQueue times each page's handler, and one sample, on a large
// queue built with set-based SQL (as bench/stats.go builds its own): N
// groups of 3 messages, 1% leased, 1% parked, 0.1% stopped, 0.1% paused,
// 5,000 dead letters. Opt-in: -large=N.
func TestLargeQueue(t *testing.T) {
	if *large == 0 {
		t.Skip("-large not set")
	}
	is := is.New(t)
	ctx := context.Background()
	q := newQueue(t, pgtransport.Config{})
	n, msgs, dead := *large, 3**large, 5000
	start := time.Now()
	is.NoErr(pgx.BeginFunc(ctx, q.pool, func(tx pgx.Tx) error {
		for _, s := range []string{
			`SET LOCAL search_path TO ` + pgx.Identifier{q.schema}.Sanitize(),
			`SET LOCAL session_replication_role = replica`,
			fmt.Sprintf(`INSERT INTO transport_messages (seq, group_id, event, published_at)
			 SELECT j, 'g' || ((j - 1) %% %[1]d + 1), 'event ' || j, now() - interval '3000 s' + (j - 1) * interval '1 ms'
			   FROM generate_series(1, %[2]d) AS j`, n, msgs),
			fmt.Sprintf(`SELECT setval(pg_get_serial_sequence('transport_messages', 'seq'), %d)`, msgs+dead),
			fmt.Sprintf(`INSERT INTO transport_groups (group_id, priority, locked_by, lock_expiry, leased_at, delivered_seq, attempts, paused)
			 SELECT 'g' || i, i %% 5,
			        CASE WHEN i %% 100 = 1 THEN 'w:bench' || i WHEN i %% 100 = 2 OR i %% 1000 = 3 THEN '' WHEN i %% 2 = 1 THEN NULL END,
			        CASE WHEN i %% 100 = 1 THEN e + 3600 - i %% 600 WHEN i %% 100 = 2 THEN e + 3600 WHEN i %% 1000 = 3 THEN 'Infinity' WHEN i %% 2 = 1 THEN e - 60 END,
			        CASE WHEN i %% 100 = 1 THEN e - i %% 600 END,
			        CASE WHEN i %% 100 IN (1, 2) OR i %% 1000 = 3 THEN i END,
			        CASE WHEN i %% 100 = 1 THEN 1 + i %% 3 WHEN i %% 100 = 2 THEN 2 WHEN i %% 1000 = 3 THEN 5 ELSE 0 END,
			        i %% 1000 = 4
			   FROM generate_series(1, %d) AS i, (SELECT extract(epoch FROM now())::float8 AS e) AS t`, n),
			fmt.Sprintf(`INSERT INTO transport_dead_letters (seq, group_id, event, priority, attempts, last_error, published_at)
			 SELECT %d + k, 'g' || k, 'dead ' || k, k %% 5, 10, 'boom', now() - interval '1 day' FROM generate_series(1, %d) AS k`, msgs, dead),
		} {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("%.60s: %w", strings.TrimSpace(s), err)
			}
		}
		return nil
	}))
	for _, table := range []string{"transport_groups", "transport_messages", "transport_dead_letters"} {
		_, err := q.pool.Exec(ctx, `VACUUM ANALYZE `+pgx.Identifier{q.schema, table}.Sanitize())
		is.NoErr(err)
	}
	t.Logf("loaded %d groups, %d messages, %d dead letters in %s", n, msgs, dead, time.Since(start).Round(time.Second))

	s, err := New(Config{Transport: q.tr, DB: q.pool, Schema: q.schema})
	is.NoErr(err)
	timeIt := func(name string, f func()) {
		var runs []time.Duration
		for range 5 {
			start := time.Now()
			f()
			runs = append(runs, time.Since(start))
		}
		slices.Sort(runs)
		t.Logf("%-44s median %6.1f ms  [%6.1f-%6.1f]", name, ms(runs[2]), ms(runs[0]), ms(runs[4]))
	}
	timeIt("sample (Stats + counters)", func() {
		sm, err := s.sample(ctx)
		is.NoErr(err)
		s.record(sm, nil)
	})
	for _, path := range []string{
		"/", "/api/overview",
		"/groups?list=oldest", "/groups?list=held", "/groups?list=attempts", "/groups?list=parked",
		"/groups?list=stopped", "/groups?list=paused", "/groups?list=all",
		"/groups?list=all&offset=500000", "/groups?list=oldest&offset=5000",
		"/group?g=g500001", "/dead", "/dead?after=" + fmt.Sprint(msgs+4000), "/dead/letter?seq=" + fmt.Sprint(msgs+2500),
	} {
		timeIt("GET "+path, func() {
			w := httptest.NewRecorder()
			r := httptest.NewRequest("GET", "http://127.0.0.1"+path, nil)
			s.ServeHTTP(w, r)
			is.Equal(w.Code, 200) // path
		})
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
