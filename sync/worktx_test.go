package sync_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// TestWorkTxClaimsInTheHandlersTransaction: the blocking WorkTx claims a
// slot's next lease inside the handler's transaction, so a message costs
// one commit. With one slot and two groups, the row version of the second
// group's lease was written by the first message's transaction: its xmin
// is that transaction's id.
func TestWorkTxClaimsInTheHandlersTransaction(t *testing.T) {
	is := is.New(t)
	db := pgtest.New(t, 4)
	tr, err := pgsync.New(ctx(t), db.Pool, pgtransport.Config{Schema: db.Schema})
	is.NoErr(err)
	defer tr.Close()
	_, err = tr.Publish(ctx(t), "a", "first", 0) // never-served groups go in arrival order
	is.NoErr(err)
	_, err = tr.Publish(ctx(t), "b", "second", 0)
	is.NoErr(err)

	type seen struct {
		group     string
		xid, xmin int64 // the handler's transaction; b's lease row's creator
		err       error
	}
	got := make(chan seen, 2)
	wctx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- tr.WorkTx(wctx, pgtransport.WorkerConfig{WorkerID: "w", Concurrency: 1, Visibility: time.Minute},
			func(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease, state []byte) ([]byte, error) {
				s := seen{group: l.Group}
				s.err = tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint % 4294967296,
				                               (SELECT xmin::text::bigint FROM `+pgx.Identifier{db.Schema, "transport_groups"}.Sanitize()+` WHERE group_id = 'b')`).
					Scan(&s.xid, &s.xmin)
				got <- s
				return state, s.err
			})
	}()
	var first, second seen
	for i, s := range []*seen{&first, &second} {
		select {
		case *s = <-got:
		case <-time.After(20 * time.Second):
			t.Fatalf("message %d never handled", i+1)
		}
	}
	cancel()
	is.NoErr(<-done)
	is.NoErr(first.err)
	is.NoErr(second.err)
	is.True(first.xid != 0)
	is.Equal(first.group, "a")
	is.Equal(second.group, "b")
	is.Equal(second.xmin, first.xid) // b was leased by a's transaction
}

// TestWorkTxClaimFailureIsNotTheMessages: when the claim sent with the
// ack fails (the ack succeeded; the transaction cannot commit), the
// handler's transaction is rolled back and the message given back, not
// failed: it is handled again as the same attempt, and its effect is
// applied once. A trigger refuses the claim's update of the next group in
// every transaction of a's handler: the runtime then acks without
// claiming for a while, so the second run commits (rather than a's
// message coming back without end).
func TestWorkTxClaimFailureIsNotTheMessages(t *testing.T) {
	is := is.New(t)
	db := pgtest.New(t, 4)
	tr, err := pgsync.New(ctx(t), db.Pool, pgtransport.Config{Schema: db.Schema, Policy: &pgtransport.Policy{MaxAttempts: 1}})
	is.NoErr(err)
	defer tr.Close()
	groups := pgx.Identifier{db.Schema, "transport_groups"}.Sanitize()
	effects := pgx.Identifier{db.Schema, "effects"}.Sanitize()
	_, err = db.Pool.Exec(ctx(t), `
		CREATE TABLE effects (group_id TEXT, attempt INT);
		CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'claims refused in this transaction'; END $$;
		CREATE TRIGGER refuse BEFORE UPDATE ON `+groups+` FOR EACH ROW
		  WHEN (current_setting('test.refuse', true) = 'on' AND NEW.locked_by <> '') EXECUTE FUNCTION refuse()`)
	is.NoErr(err)
	_, err = tr.Publish(ctx(t), "a", "first", 0) // acked by a write that frees a's row: the trigger lets it by
	is.NoErr(err)
	_, err = tr.Publish(ctx(t), "b", "second", 0)
	is.NoErr(err)

	runs := make(chan int, 4) // a's attempts, run by run
	wctx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- tr.WorkTx(wctx, pgtransport.WorkerConfig{WorkerID: "w", Concurrency: 1, Visibility: time.Minute},
			func(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease, state []byte) ([]byte, error) {
				if _, err := tx.Exec(ctx, `INSERT INTO `+effects+` VALUES ($1, $2)`, l.Group, l.Attempt); err != nil {
					return nil, err
				}
				if l.Group == "a" {
					select {
					case runs <- l.Attempt:
					default: // more runs than the test counts: it fails below
					}
					if _, err := tx.Exec(ctx, `SELECT set_config('test.refuse', 'on', true)`); err != nil {
						return nil, err
					}
				}
				return state, nil
			})
	}()
	var n int
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT count(*) FROM `+pgx.Identifier{db.Schema, "transport_messages"}.Sanitize()).Scan(&n))
		if n == 0 || time.Now().After(deadline) {
			break
		}
	}
	cancel()
	is.NoErr(<-done)
	is.Equal(n, 0) // both handled
	close(runs)
	var attempts []int
	for a := range runs {
		attempts = append(attempts, a)
	}
	is.Equal(attempts, []int{1, 1}) // run again, as the same attempt: the claim's failure was not a's
	var dead, effectsA int
	is.NoErr(db.Pool.QueryRow(ctx(t), `SELECT (SELECT count(*) FROM `+pgx.Identifier{db.Schema, "transport_dead_letters"}.Sanitize()+`),
	                                         (SELECT count(*) FROM `+effects+` WHERE group_id = 'a')`).Scan(&dead, &effectsA))
	is.Equal(dead, 0)     // MaxAttempts 1: a Fail would have dead-lettered it
	is.Equal(effectsA, 1) // the rolled-back run's insert is not there
}
