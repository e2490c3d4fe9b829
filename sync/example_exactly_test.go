package sync_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// Exactly-once effects: an account's balance folded from its ordered
// events. WorkTx hands the handler a transaction and the group's state
// (the balance so far); the handler writes its effect (a ledger row)
// through the transaction and returns the new balance, and the runtime
// commits the row, the balance and the ack together, or none of them. A
// worker that dies, a lease that lapses while another worker takes the
// account, a COMMIT whose reply is lost: each ledger row is still written
// once, in the events' order, and the balance is the fold of all of them.
func ExampleTransport_WorkTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // the application's pool: the ledger is beside the queue
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	tr, err := pgsync.New(ctx, pool, pgtransport.Config{
		Policy: &pgtransport.Policy{StateRetention: 24 * time.Hour}, // an account's balance outlives a quiet spell
	})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (id BIGSERIAL PRIMARY KEY, account TEXT, amount BIGINT, balance BIGINT)`); err != nil {
		log.Fatal(err)
	}

	for _, event := range []string{"deposit 100", "withdraw 30", "deposit 5"} {
		if _, err := tr.Publish(ctx, "acct-7", event, 0); err != nil {
			log.Fatal(err)
		}
	}

	wctx, stop := context.WithCancel(ctx)
	var handled atomic.Int32
	err = tr.WorkTx(wctx, pgtransport.WorkerConfig{Concurrency: 4},
		func(ctx context.Context, tx pgx.Tx, lease *pgtransport.Lease, state []byte) ([]byte, error) {
			balance, _ := strconv.ParseInt(string(state), 10, 64) // no state yet: 0
			kind, n, _ := strings.Cut(lease.Event, " ")
			amount, err := strconv.ParseInt(n, 10, 64)
			if err != nil {
				return nil, err // rolled back, and the attempt failed
			}
			if kind == "withdraw" {
				amount = -amount
			}
			balance += amount
			if _, err := tx.Exec(ctx, `INSERT INTO ledger (account, amount, balance) VALUES ($1, $2, $3)`,
				lease.Group, amount, balance); err != nil {
				return nil, err
			}
			if handled.Add(1) == 3 {
				stop() // Work commits this one, and returns
			}
			return []byte(strconv.FormatInt(balance, 10)), nil // committed with the row and the ack
		})
	if err != nil {
		log.Fatal(err)
	}

	rows, _ := pool.Query(ctx, `SELECT amount, balance FROM ledger ORDER BY id`)
	for rows.Next() {
		var amount, balance int64
		_ = rows.Scan(&amount, &balance)
		fmt.Printf("%+d -> %d\n", amount, balance)
	}
	state, err := tr.State(ctx, "acct-7") // drained, and kept for the StateRetention
	fmt.Printf("balance %s, %v\n", state, err)
	// Output:
	// +100 -> 100
	// -30 -> 70
	// +5 -> 75
	// balance 75, <nil>
}
