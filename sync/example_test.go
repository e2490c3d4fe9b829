package sync_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/pgtransport/pgtransport"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// A blocking worker loop: claim the next group's head, handle it, ack it.
func ExampleTransport_Claim() {
	ctx := context.Background()
	tr, err := pgsync.FromDSN(ctx, "postgres://localhost/app", pgtransport.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()

	handle := func(group, event string) error { return nil }
	for ctx.Err() == nil {
		lease, err := tr.Claim(ctx, "worker-1", 30*time.Second, 0)
		if err != nil {
			log.Fatal(err)
		}
		if lease == nil {
			time.Sleep(100 * time.Millisecond) // nothing claimable
			continue
		}
		if err := handle(lease.Group, lease.Event); err != nil {
			_ = tr.Nack(ctx, lease, 5*time.Second) // the same message again in 5 s
			continue
		}
		if err := tr.Ack(ctx, lease); errors.Is(err, pgtransport.ErrLeaseLost) {
			log.Printf("lease on %s lapsed; the message will be redelivered", lease.Group)
		}
	}
}
