package async_test

import (
	"context"
	"fmt"
	"log"
	"maps"
	"os"
	"slices"
	stdsync "sync"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
)

// An async worker with the runtime: Work feeds up to Concurrency handlers
// from one Stream (woken by notifications, acks batched into its
// round-trips), with the same guarantees as the blocking Work: nil acks,
// an error or a panic fails the message, slow handlers' leases are kept
// alive, and a shutdown lets running handlers finish. Handlers of
// different groups run concurrently; each group's run in order.
func ExampleTransport_Work() {
	ctx := context.Background()
	tr, err := async.FromDSN(ctx, os.Getenv("DATABASE_URL"), pgtransport.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()

	r := <-tr.PublishMany(ctx, []pgtransport.Message{
		{Group: "order-1", Event: "created"}, {Group: "order-2", Event: "created"},
		{Group: "order-1", Event: "paid"}, {Group: "order-2", Event: "paid"},
	})
	if r.Err != nil {
		log.Fatal(r.Err)
	}

	wctx, stop := context.WithCancel(ctx)
	var (
		mu  stdsync.Mutex
		got = map[string][]string{}
	)
	err = tr.Work(wctx, pgtransport.WorkerConfig{Concurrency: 64, Visibility: 30 * time.Second},
		func(ctx context.Context, lease *pgtransport.Lease) error {
			mu.Lock()
			defer mu.Unlock()
			got[lease.Group] = append(got[lease.Group], lease.Event)
			if len(got["order-1"])+len(got["order-2"]) == len(r.Value) {
				stop()
			}
			return nil
		})
	fmt.Println("worker stopped:", err)
	for _, group := range slices.Sorted(maps.Keys(got)) {
		fmt.Println(group, got[group])
	}
	// Output:
	// worker stopped: <nil>
	// order-1 [created paid]
	// order-2 [created paid]
}
