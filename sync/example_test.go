package sync_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// A blocking worker: ClaimWait blocks until it holds a lease, so an idle
// worker waits for work instead of polling. Here the worker runs on its own
// goroutine until its ctx ends, while the program publishes an order's
// events; the worker handles them one at a time, in publish order.
func ExampleTransport_ClaimWait() {
	ctx := context.Background()
	tr, err := pgsync.FromDSN(ctx, os.Getenv("DATABASE_URL"), pgtransport.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()

	acked := make(chan struct{})
	handle := func(group, event string) error {
		fmt.Println(group, event)
		return nil
	}
	worker := func(ctx context.Context) error {
		for {
			lease, err := tr.ClaimWait(ctx, "worker-1", 30*time.Second, 0)
			if err != nil {
				return err // ctx ended, or the database failed
			}
			if err := handle(lease.Group, lease.Event); err != nil {
				_ = tr.Nack(ctx, lease, 5*time.Second) // the same message again in 5 s
				continue
			}
			if err := tr.Ack(ctx, lease); err != nil && !errors.Is(err, pgtransport.ErrLeaseLost) {
				return err
			} // ErrLeaseLost: the lease lapsed and the message comes round again
			acked <- struct{}{}
		}
	}

	wctx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- worker(wctx) }()

	for _, event := range []string{"created", "paid", "shipped"} {
		if _, err := tr.Publish(ctx, "order-42", event, 0); err != nil {
			log.Fatal(err)
		}
	}
	for range 3 {
		<-acked // stopped only once all three are acked: a message left unacked comes back after its visibility
	}
	stop()
	err = <-stopped
	fmt.Println("worker stopped:", errors.Is(err, context.Canceled))
	// Output:
	// order-42 created
	// order-42 paid
	// order-42 shipped
	// worker stopped: true
}

// PublishTx publishes inside the caller's transaction: the message commits
// or rolls back with the caller's own writes, and no claim sees it before
// the commit.
func ExampleTransport_PublishTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // the application's pool
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	tr, err := pgsync.New(ctx, pool, pgtransport.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}

	placeOrder := func(id string, paid bool) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, id); err != nil {
				return err
			}
			if _, err := tr.PublishTx(ctx, tx, id, "placed", 0); err != nil {
				return err
			}
			if !paid {
				return errors.New("payment declined") // rolls back the order and its message
			}
			return nil
		})
	}
	fmt.Println("order-1:", placeOrder("order-1", true))
	fmt.Println("order-2:", placeOrder("order-2", false))

	for {
		lease, err := tr.Claim(ctx, "worker-1", 30*time.Second, 0)
		if err != nil {
			log.Fatal(err)
		}
		if lease == nil {
			break // nothing more to claim
		}
		fmt.Println("claimed:", lease.Group, lease.Event)
		if err := tr.Ack(ctx, lease); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// order-1: <nil>
	// order-2: payment declined
	// claimed: order-1 placed
}

// AckNext serves a hot group at one round-trip per message: it acks and,
// while the group has more, hands back its next message under the same
// lease. After Config.KeepWhileWaiting messages in a row (2 here) while
// another group waits, or after Config.MaxKeep (3 here) in any case, it
// frees the group, which then waits its turn behind the others.
func ExampleTransport_AckNext() {
	ctx := context.Background()
	tr, err := pgsync.FromDSN(ctx, os.Getenv("DATABASE_URL"), pgtransport.Config{MaxKeep: 3, KeepWhileWaiting: 2})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()

	msgs := []pgtransport.Message{{Group: "other", Event: "event 1"}}
	for i := 1; i <= 6; i++ {
		msgs = append(msgs, pgtransport.Message{Group: "hot", Event: fmt.Sprintf("event %d", i)})
	}
	if _, err := tr.PublishMany(ctx, msgs); err != nil {
		log.Fatal(err)
	}

	lease, err := tr.Claim(ctx, "worker-1", 30*time.Second, 0)
	for lease != nil && err == nil {
		fmt.Printf("%s %s (kept %d)\n", lease.Group, lease.Event, lease.Kept)
		var next *pgtransport.Lease
		if next, err = tr.AckNext(ctx, lease, 30*time.Second); err != nil {
			break
		}
		if next != nil {
			lease = next // the same group, no claim in between
			continue
		}
		lease, err = tr.Claim(ctx, "worker-1", 30*time.Second, 0) // the round-robin's next group
	}
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// hot event 1 (kept 0)
	// hot event 2 (kept 1)
	// other event 1 (kept 0)
	// hot event 3 (kept 0)
	// hot event 4 (kept 1)
	// hot event 5 (kept 2)
	// hot event 6 (kept 0)
}
