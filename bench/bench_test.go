// The benchmarks (go test -bench) measure the transports on a real PostgreSQL server. Every
// benchmark checks what it measured: all messages acked, per-group order
// held, tables empty at the end; a run that loses or reorders a message
// fails instead of printing a number.
package main

import (
	"context"
	"fmt"
	stdsync "sync"
	"testing"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func open(b *testing.B, conns int32) (*pgtest.DB, *pgsync.Transport) {
	b.Helper()
	db := pgtest.New(b, conns)
	tr, err := pgsync.New(context.Background(), db.Pool, pgtransport.Config{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	return db, tr
}

func BenchmarkPublish(b *testing.B) {
	for _, publishers := range []int{1, 16} {
		b.Run(fmt.Sprintf("publishers=%d", publishers), func(b *testing.B) {
			_, tr := open(b, int32(publishers)+1)
			ctx := context.Background()
			b.SetParallelism(max(1, publishers/maxprocs()))
			if publishers == 1 {
				for i := 0; b.Loop(); i++ {
					if _, err := tr.Publish(ctx, fmt.Sprintf("g%d", i%1000), "event", 0); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				b.RunParallel(func(pb *testing.PB) {
					for i := 0; pb.Next(); i++ {
						if _, err := tr.Publish(ctx, fmt.Sprintf("g%d", i%1000), "event", 0); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// BenchmarkClaimAck drains a preloaded backlog of b.N messages spread over
// the groups with the given number of workers, each on its own connection,
// one claim and one ack (two round-trips) per message.
func BenchmarkClaimAck(b *testing.B) {
	for _, workers := range []int{1, 16} {
		for _, groups := range []int{1, 100, 10_000} {
			b.Run(fmt.Sprintf("workers=%d/groups=%d", workers, groups), func(b *testing.B) {
				claimAck(b, workers, groups)
			})
		}
	}
}

func claimAck(b *testing.B, workers, groups int) {
	db, tr := open(b, int32(workers)+1)
	ctx := context.Background()
	n := b.N
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO transport_messages (group_id, event)
		SELECT 'g' || (i % $1), i::text FROM generate_series(0, $2 - 1) AS i ORDER BY i`, groups, n)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO transport_groups (group_id) SELECT DISTINCT group_id FROM transport_messages;
		ANALYZE transport_groups; ANALYZE transport_messages`); err != nil {
		b.Fatal(err)
	}
	var (
		mu      stdsync.Mutex
		lastSeq = map[string]int64{}
		done    int
		errs    = make(chan error, workers)
		wg      stdsync.WaitGroup
	)
	b.ResetTimer()
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			errs <- func() error {
				id := fmt.Sprintf("w%d", w)
				for {
					mu.Lock()
					finished := done >= n
					mu.Unlock()
					if finished {
						return nil
					}
					l, err := tr.Claim(ctx, id, 30*time.Second, 0)
					if err != nil {
						return err
					}
					if l == nil {
						continue // another worker holds the only claimable group
					}
					mu.Lock()
					if l.Seq <= lastSeq[l.Group] {
						mu.Unlock()
						return fmt.Errorf("group %s: seq %d after %d", l.Group, l.Seq, lastSeq[l.Group])
					}
					lastSeq[l.Group] = l.Seq
					mu.Unlock()
					if err := tr.Ack(ctx, l); err != nil {
						return err
					}
					mu.Lock()
					done++
					mu.Unlock()
				}
			}()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	var left int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM transport_messages) + (SELECT count(*) FROM transport_groups AS g WHERE to_jsonb(g) ->> 'drained_at' IS NULL)`).Scan(&left); err != nil {
		b.Fatal(err)
	}
	if done != n || left != 0 {
		b.Fatalf("acked %d of %d, %d rows left", done, n, left)
	}
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
}

// BenchmarkAckMany settles a batch of leases in one AckMany; µs/ack should
// stay flat from 10 to 1,000 a batch (a batch that searches an array per
// row grows with its size). drained: each group's only message, so every
// ack deletes its group row; freed: each group keeps a message, so every
// ack frees its row.
func BenchmarkAckMany(b *testing.B) {
	for _, shape := range []string{"drained", "freed"} {
		for _, batch := range []int{10, 100, 1000} {
			b.Run(fmt.Sprintf("%s/batch=%d", shape, batch), func(b *testing.B) {
				ackMany(b, batch, shape == "freed")
			})
		}
	}
}

func ackMany(b *testing.B, batch int, more bool) {
	_, tr := open(b, 2)
	ctx := context.Background()
	var acking time.Duration
	for i := 0; b.Loop(); i++ {
		msgs := make([]pgtransport.Message, 0, 2*batch)
		for g := range batch {
			msgs = append(msgs, pgtransport.Message{Group: fmt.Sprintf("i%d-g%d", i, g), Event: "first"})
			if more {
				msgs = append(msgs, pgtransport.Message{Group: fmt.Sprintf("i%d-g%d", i, g), Event: "second"})
			}
		}
		if _, err := tr.PublishMany(ctx, msgs); err != nil {
			b.Fatal(err)
		}
		leases, err := tr.ClaimMany(ctx, "w", time.Minute, 0, batch)
		if err != nil {
			b.Fatal(err)
		}
		if len(leases) != batch {
			b.Fatalf("claimed %d of %d", len(leases), batch)
		}
		start := time.Now()
		errs, err := tr.AckMany(ctx, leases)
		acking += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(acking.Microseconds())/float64(b.N*batch), "µs/ack")
}
