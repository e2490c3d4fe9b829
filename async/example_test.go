package async_test

import (
	"context"
	"log"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
)

// A select-on-channel consumer: leases from up to 4 groups at once, handled
// concurrently, acked as each finishes; it stops with ctx.
func ExampleTransport_Stream() {
	ctx := context.Background()
	tr, err := async.FromDSN(ctx, "postgres://localhost/app", pgtransport.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close() // stops the stream, gives back what it claimed and did not deliver

	s, err := tr.Stream(ctx, async.StreamConfig{WorkerID: "worker-1", Visibility: 30 * time.Second, MaxInFlight: 4})
	if err != nil {
		log.Fatal(err)
	}
	handle := func(group, event string) error { return nil }
	done := make(chan error, 4) // room for every lease in flight: no handler goroutine ever blocks
	inFlight := 0
	for {
		select {
		case lease, ok := <-s.C():
			if !ok {
				log.Printf("stream stopped: %v", s.Err())
				return
			}
			inFlight++
			go func() { // one goroutine per lease: groups are handled in parallel, each in order
				if err := handle(lease.Group, lease.Event); err != nil {
					done <- <-tr.Nack(ctx, lease, 5*time.Second) // the same message again in 5 s
					return
				}
				done <- <-tr.Ack(ctx, lease)
			}()
		case err := <-done:
			inFlight--
			if err != nil {
				log.Printf("settle: %v", err) // ErrLeaseLost: it lapsed and will be redelivered
			}
		}
	}
}
