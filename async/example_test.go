package async_test

import (
	"context"
	"fmt"
	"log"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
)

// A select-on-channel consumer: a Stream delivers leases from up to
// MaxInFlight groups at once; each is handled on its own goroutine and
// settled as it finishes. A group's next message is delivered only after
// its previous one is acked, so each group is handled in publish order
// while different groups run in parallel.
func ExampleTransport_Stream() {
	ctx := context.Background()
	tr, err := async.FromDSN(ctx, os.Getenv("DATABASE_URL"), pgtransport.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close() // stops its streams, gives back what they claimed and did not deliver

	r := <-tr.PublishMany(ctx, []pgtransport.Message{
		{Group: "order-1", Event: "created"}, {Group: "order-2", Event: "created"},
		{Group: "order-1", Event: "paid"}, {Group: "order-2", Event: "paid"},
	})
	if r.Err != nil {
		log.Fatal(r.Err)
	}

	s, err := tr.Stream(ctx, async.StreamConfig{WorkerID: "worker-1", Visibility: 30 * time.Second, MaxInFlight: 4})
	if err != nil {
		log.Fatal(err)
	}
	handle := func(group, event string) error { return nil }
	got := map[string][]string{}
	settled := make(chan error, 4) // room for every lease in flight: no handler goroutine blocks
	for done := 0; done < len(r.Value); {
		select {
		case lease, ok := <-s.C():
			if !ok {
				log.Fatal(s.Err()) // why the stream stopped
			}
			got[lease.Group] = append(got[lease.Group], lease.Event)
			go func() {
				if err := handle(lease.Group, lease.Event); err != nil {
					settled <- <-tr.Nack(ctx, lease, 5*time.Second) // the same message again in 5 s
					return
				}
				settled <- <-tr.Ack(ctx, lease)
			}()
		case err := <-settled:
			if err != nil {
				log.Fatal(err) // ErrLeaseLost: the lease lapsed and the message comes round again
			}
			done++
		}
	}
	s.Close()
	_, open := <-s.C()
	fmt.Println("C open:", open, "- Err:", s.Err())

	for _, group := range slices.Sorted(maps.Keys(got)) {
		fmt.Println(group, got[group])
	}
	// Output:
	// C open: false - Err: pgtransport: stream closed
	// order-1 [created paid]
	// order-2 [created paid]
}
