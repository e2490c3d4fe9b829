package schema_test

import (
	"context"
	"errors"
	"fmt"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// TestProxyPartitionRestart: one of four partitions (its own throwaway
// cluster) is stopped for two seconds and started again while four
// plain-SQL consumers work through the proxy. While it is down the other
// partitions' work is still claimed and acked; afterwards every message
// is delivered, each group's in order (a message whose ack was lost comes
// again when its lease lapses, never after a later one), one holder per
// group at a time, and nothing is left on any partition.
func TestProxyPartitionRestart(t *testing.T) {
	t.Parallel()
	cl := pgtest.PartitionServer(t)
	p := pgtest.PartitionsOn(t, 4, map[int]string{1: cl.DSN()})
	const groups, per = 40, 15
	for m := range per {
		for g := range groups {
			if _, err := p.Proxy.Exec(ctx(t), `SELECT harel_publish($1, $2)`, fmt.Sprint("r", g), fmt.Sprint(m)); err != nil {
				t.Fatal(err)
			}
		}
	}
	var down atomic.Bool
	var acks, acksWhileDown atomic.Int64
	var mu stdsync.Mutex
	holder := map[string]string{}
	last := map[string]int64{} // each group's last handed-out seq
	seen := map[string]map[int64]bool{}
	var violations []string
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg stdsync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; runCtx.Err() == nil; i++ {
				token := fmt.Sprintf("w%d:%d", w, i)
				var group string
				var seq int64
				err := p.Proxy.QueryRow(runCtx, `SELECT group_id, seq FROM harel_claim(`+nowSQL+`, `+nowSQL+` + 2, $1)`, token).Scan(&group, &seq)
				if err != nil { // nothing claimable, or a partition's error: again shortly
					time.Sleep(20 * time.Millisecond)
					continue
				}
				mu.Lock()
				if h := holder[group]; h != "" {
					violations = append(violations, fmt.Sprintf("group %s claimed by %s while %s holds it", group, token, h))
				}
				if seq < last[group] {
					violations = append(violations, fmt.Sprintf("group %s: seq %d handed out after %d", group, seq, last[group]))
				}
				holder[group], last[group] = token, seq
				if seen[group] == nil {
					seen[group] = map[int64]bool{}
				}
				seen[group][seq] = true
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				delete(holder, group) // before the ack: once it commits, another may claim
				mu.Unlock()
				var acked bool
				if err := p.Proxy.QueryRow(runCtx, `SELECT harel_ack($1, $2, $3, `+nowSQL+`)`, group, seq, token).Scan(&acked); err == nil && acked {
					acks.Add(1)
					if down.Load() {
						acksWhileDown.Add(1)
					}
				}
				// An ack that failed with its partition: the lease lapses
				// and the message comes again.
			}
		})
	}
	for wait := time.Now().Add(time.Minute); acks.Load() < groups*per/3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(wait) {
			t.Fatalf("%d acks in a minute before the restart", acks.Load())
		}
	}
	if err := cl.StopKeep(); err != nil {
		t.Fatal(err)
	}
	down.Store(true)
	time.Sleep(2 * time.Second)
	down.Store(false)
	if err := cl.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		left := 0
		for _, part := range p.Parts {
			var n int
			if err := part.QueryRow(ctx(t), `SELECT count(*) FROM transport_messages`).Scan(&n); err != nil {
				n = 1 // not back yet
			}
			left += n
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages still queued a minute after the restart", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations {
		t.Error(v)
	}
	delivered := 0
	for _, s := range seen {
		delivered += len(s)
	}
	if delivered != groups*per {
		t.Errorf("%d distinct messages delivered, want %d", delivered, groups*per)
	}
	if acksWhileDown.Load() == 0 {
		t.Error("no ack while a partition was down: the other partitions' work waited for it")
	}
	t.Logf("%d acks, %d while partition 1 was down", acks.Load(), acksWhileDown.Load())
	var n int
	err := p.Proxy.QueryRow(ctx(t), `SELECT count(*) FROM harel_claim(`+nowSQL+`, `+nowSQL+` + 2, 'after')`).Scan(&n)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("a claim through the proxy after the restart: %v", err)
	}
}
