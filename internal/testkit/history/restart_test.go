package history_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// TestRestart restarts PostgreSQL mid-run: blocking workers, an async
// stream and its listener must all recover on their own, and every message
// published before, during and after is delivered. It needs a server the
// harness owns: CI runs it with PGTRANSPORT_TEST_THROWAWAY=1.
func TestRestart(t *testing.T) {
	cluster := pgtest.Server(t)
	if cluster == nil {
		t.Skip("restarts only a throwaway cluster: run with PGTRANSPORT_TEST_THROWAWAY=1 (CI does)")
	}
	r := newRig(t)
	st, at := r.transports()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	s, err := at.Stream(ctx, async.StreamConfig{WorkerID: "a", Visibility: time.Second, MaxInFlight: 4})
	if err != nil {
		t.Fatal(err)
	}
	<-s.Ready()
	delivered := make(chan string, 10_000)
	done := make(chan struct{})
	go func() { // async consumer
		defer close(done)
		for l := range s.C() {
			if err := <-at.Ack(context.Background(), l); err == nil {
				delivered <- l.Event
			}
		}
	}()
	workers := make(chan struct{})
	go func() { // a blocking worker
		defer close(workers)
		for ctx.Err() == nil {
			l, err := st.ClaimWait(ctx, "s", time.Second, 0)
			if err != nil {
				time.Sleep(20 * time.Millisecond) // kept: a retry's pause while the server is down
				continue
			}
			if err := st.Ack(context.Background(), l); err == nil {
				delivered <- l.Event
			}
		}
	}()
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			for {
				_, err := st.Publish(context.Background(), fmt.Sprint("g", i%50), fmt.Sprint(i), 0)
				if err == nil {
					break
				}
				time.Sleep(50 * time.Millisecond) // kept: a retry's pause while the server is down
			}
		}
	}
	publish(0, 200)
	if err := cluster.StopKeep(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // kept: the outage under test lasts a while, so clients see it
	if err := cluster.Start(); err != nil {
		t.Fatal(err)
	}
	publish(200, 400)
	select {
	case <-s.Ready(): // the listener is back
	case <-time.After(30 * time.Second):
		t.Fatal("the listener never came back after the restart")
	}
	got := map[string]int{}
	for deadline := time.After(time.Minute); len(got) < 400; {
		select {
		case ev := <-delivered:
			got[ev]++
		case <-deadline:
			t.Fatalf("%d of 400 messages delivered after the restart", len(got))
		}
	}
	stop()
	<-done
	<-workers
	var left int
	if err := r.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM transport_messages`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d messages left", left)
	}
	t.Logf("400 messages delivered across a restart (%d redelivered)", func() int {
		n := 0
		for _, c := range got {
			n += c - 1
		}
		return n
	}())
}
