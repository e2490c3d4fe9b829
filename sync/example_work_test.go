package sync_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"sync/atomic"
	"time"

	"github.com/pgtransport/pgtransport"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// A blocking worker with the runtime: Work runs the handler on up to
// Concurrency groups at once, acks what it returns nil for, fails (retries,
// then dead-letters) what it returns an error for or panics on, keeps the
// leases of slow handlers alive, and on shutdown lets running handlers
// finish before it returns. A real program runs it until SIGTERM:
//
//	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
//	defer stop()
//	err := tr.Work(ctx, pgtransport.WorkerConfig{Concurrency: 16}, handle)
//
// Here the program stops it once the order's three events are handled.
func ExampleTransport_Work() {
	ctx := context.Background()
	tr, err := pgsync.FromDSN(ctx, os.Getenv("DATABASE_URL"), pgtransport.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()

	for _, event := range []string{"created", "paid", "shipped"} {
		if _, err := tr.Publish(ctx, "order-7", event, 0); err != nil {
			log.Fatal(err)
		}
	}

	wctx, stop := context.WithCancel(ctx)
	var handled atomic.Int32
	err = tr.Work(wctx, pgtransport.WorkerConfig{Concurrency: 4, Visibility: 30 * time.Second},
		func(ctx context.Context, lease *pgtransport.Lease) error {
			fmt.Println(lease.Group, lease.Event) // one group: one handler at a time, in order
			if handled.Add(1) == 3 {
				stop() // Work finishes this handler, acks it, and returns
			}
			return nil
		})
	fmt.Println("worker stopped:", err)
	// Output:
	// order-7 created
	// order-7 paid
	// order-7 shipped
	// worker stopped: <nil>
}
