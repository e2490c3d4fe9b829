package contract

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// exactlyOnceCases: the ack inside the caller's transaction, the group's
// state saved with it, and the transactional handler: on partitions, in
// a transaction on the group's home.
var exactlyOnceCases = []testCase{
	{"AckTxCommitAppliesBoth", ackTxCommitAppliesBoth},
	{"AckTxRollbackKeepsTheMessage", ackTxRollbackKeepsTheMessage},
	{"AckTxOfALostLease", ackTxOfALostLease},
	{"StaleHolderCannotOverwriteState", staleHolderCannotOverwriteState},
	{"StateTooLargeWritesNothing", stateTooLargeWritesNothing},
	{"StateRetention", stateRetention},
	{"StatePlainSQL", statePlainSQL},
	{"WorkTxFoldsInOrder", workTxFoldsInOrder},
	{"WorkTxFailedCommitHoldsNothing", workTxFailedCommitHoldsNothing},
	{"WorkTxDeadLetterNowCommitsNothing", workTxDeadLetterNowCommitsNothing},
	{"RefusesBadInput", refusesBadInput},
}

func (e *env) exactly() Exactly {
	e.t.Helper()
	x, ok := e.tr.(Exactly)
	if !ok {
		e.t.Fatalf("%T lacks the exactly-once calls (contract.Exactly)", e.tr)
	}
	return x
}

// effects creates the user's table the cases write their effects to, on
// every partition: a group's effects go to its home's.
func (e *env) effects() {
	e.t.Helper()
	e.exec(`CREATE TABLE effects (id BIGSERIAL PRIMARY KEY, group_id TEXT NOT NULL, seq BIGINT NOT NULL)`)
}

// effect writes l's effect in tx.
func (e *env) effect(tx pgx.Tx, l *pgtransport.Lease) {
	e.t.Helper()
	if _, err := tx.Exec(e.ctx(), `INSERT INTO effects (group_id, seq) VALUES ($1, $2)`, l.Group, l.Seq); err != nil {
		e.t.Fatalf("effect: %v", err)
	}
}

func (e *env) state(group string) []byte {
	e.t.Helper()
	s, err := e.exactly().State(e.ctx(), group)
	if err != nil {
		e.t.Fatalf("state %s: %v", group, err)
	}
	return s
}

// ackTxCommitAppliesBoth: the caller's write and the ack commit
// together; nothing of either is seen before the commit.
func ackTxCommitAppliesBoth(is *is.I, e *env) {
	x := e.exactly()
	e.effects()
	e.publish("g", "g-0", 0)
	l := e.claim("w", 0)
	tx := e.begin("g")
	e.effect(tx, l)
	is.NoErr(x.AckTx(e.ctx(), tx, l))                                          // held
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 1)            // not before the commit
	is.Equal(e.count(`SELECT count(*) FROM effects`), 0)                       // nor the write
	is.NoErr(tx.Commit(e.ctx()))                                               // both at once
	is.Equal(e.count(`SELECT count(*) FROM effects WHERE seq = $1`, l.Seq), 1) // the effect
	m, g := e.rows()
	is.Equal(m+g, 0) // and the ack: the group drained
}

// ackTxRollbackKeepsTheMessage: a rolled-back AckTx leaves the
// message queued and the lease held as before: it can be acked again.
func ackTxRollbackKeepsTheMessage(is *is.I, e *env) {
	x := e.exactly()
	e.effects()
	e.publish("g", "g-0", 0)
	e.publish("g", "g-1", 0)
	l := e.claim("w", 0)
	tx := e.begin("g")
	e.effect(tx, l)
	is.NoErr(x.AckTx(e.ctx(), tx, l))
	is.NoErr(tx.Rollback(e.ctx()))
	is.Equal(e.count(`SELECT count(*) FROM effects`), 0)                                  // rolled back
	is.Equal(e.count(`SELECT count(*) FROM transport_messages WHERE seq = $1`, l.Seq), 1) // still queued
	is.Equal(e.claim("other", 0), nil)                                                    // still held
	tx = e.begin("g")
	e.effect(tx, l)
	is.NoErr(x.AckTx(e.ctx(), tx, l)) // acked again, and this time committed
	is.NoErr(tx.Commit(e.ctx()))
	next := e.claim("w", 0)
	is.True(next != nil)
	is.Equal(next.Event, "g-1") // the group goes on
	is.Equal(e.count(`SELECT count(*) FROM effects`), 1)
}

// ackTxOfALostLease: a holder whose lease lapsed and whose group
// another worker took gets ErrLeaseLost inside its transaction; its
// rollback leaves nothing, and the new holder's ack applies the message.
func ackTxOfALostLease(is *is.I, e *env) {
	x := e.exactly()
	e.effects()
	e.publish("g", "g-0", 0)
	stale, err := e.tr.Claim(e.ctx(), "old", time.Second, 0)
	is.NoErr(err)
	e.clock.Advance(2 * time.Second) // the lease lapses
	fresh := e.claim("new", 0)
	is.Equal(fresh.Seq, stale.Seq) // the same message, handed out again

	tx := e.begin("g")
	e.effect(tx, stale)
	err = x.AckTx(e.ctx(), tx, stale)
	is.True(errors.Is(err, pgtransport.ErrLeaseLost)) // before the caller commits
	is.NoErr(tx.Rollback(e.ctx()))
	is.Equal(e.count(`SELECT count(*) FROM effects`), 0) // nothing of the stale attempt

	tx = e.begin("g")
	e.effect(tx, fresh)
	is.NoErr(x.AckTx(e.ctx(), tx, fresh))
	is.NoErr(tx.Commit(e.ctx()))
	is.Equal(e.count(`SELECT count(*) FROM effects`), 1) // once
}

// staleHolderCannotOverwriteState: AckStateTx is fenced: a stale
// holder's state never lands, before or after the new holder's.
func staleHolderCannotOverwriteState(is *is.I, e *env) {
	x := e.exactly()
	e.publish("g", "g-0", 0)
	e.publish("g", "g-1", 0)
	l := e.claim("w", 0)
	tx := e.begin("g")
	is.NoErr(x.AckStateTx(e.ctx(), tx, l, []byte("s0")))
	is.NoErr(tx.Commit(e.ctx()))
	is.Equal(string(e.state("g")), "s0")

	stale, err := e.tr.Claim(e.ctx(), "old", time.Second, 0)
	is.NoErr(err)
	is.Equal(stale.Event, "g-1")
	e.clock.Advance(2 * time.Second)
	fresh := e.claim("new", 0)
	is.Equal(fresh.Seq, stale.Seq)

	tx = e.begin("g")
	got, err := x.StateTx(e.ctx(), tx, "g")
	is.NoErr(err)
	is.Equal(string(got), "s0") // read in the transaction
	err = x.AckStateTx(e.ctx(), tx, stale, []byte("stale"))
	is.True(errors.Is(err, pgtransport.ErrLeaseLost)) // fenced
	is.NoErr(tx.Commit(e.ctx()))                      // even a caller that commits anyway writes nothing
	is.Equal(string(e.state("g")), "s0")

	tx = e.begin("g")
	is.NoErr(x.AckStateTx(e.ctx(), tx, fresh, []byte("s1")))
	is.NoErr(tx.Commit(e.ctx()))
	is.Equal(string(e.state("g")), "") // drained, and no retention: the state went with the row

	// A state equal to the stored one, and nil, which clears it.
	e.publish("h", "h-0", 0)
	e.publish("h", "h-1", 0)
	e.publish("h", "h-2", 0)
	for i, s := range []string{"same", "same", ""} {
		l := e.claim("w", 0)
		is.Equal(l.Event, fmt.Sprint("h-", i))
		tx = e.begin(l.Group)
		var state []byte
		if s != "" {
			state = []byte(s)
		}
		is.NoErr(x.AckStateTx(e.ctx(), tx, l, state))
		is.NoErr(tx.Commit(e.ctx()))
		if i < 2 {
			is.Equal(string(e.state("h")), s)
		}
	}
}

// stateTooLargeWritesNothing: a state over MaxStateSize is
// refused before the round-trip (the caller's transaction still usable),
// and the function refuses it too (PT008), writing nothing.
func stateTooLargeWritesNothing(is *is.I, e *env) {
	x := e.exactly()
	e.publish("g", "g-0", 0)
	l := e.claim("w", 0)
	tx := e.begin("g")
	err := x.AckStateTx(e.ctx(), tx, l, make([]byte, pgtransport.MaxStateSize+1))
	is.True(errors.Is(err, pgtransport.ErrStateTooLarge))
	is.NoErr(tx.Commit(e.ctx()))                                    // the transaction is still usable
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 1) // not acked
	is.Equal(e.state("g"), nil)                                     // no state

	// The plain-SQL form refuses it with PT008.
	_, err = e.poolAt(l.Group).Exec(e.ctx(), `SELECT harel_ack_state($1, $2, $3, NULL, $4)`,
		l.Group, l.Seq, l.Token, make([]byte, pgtransport.MaxStateSize+1))
	var pgErr *pgconn.PgError
	is.True(errors.As(err, &pgErr))
	is.Equal(pgErr.Code, "PT008")
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 1) // nothing written
	is.Equal(e.state("g"), nil)

	tx = e.begin("g")
	is.NoErr(x.AckStateTx(e.ctx(), tx, l, make([]byte, pgtransport.MaxStateSize))) // the limit itself
	is.NoErr(tx.Rollback(e.ctx()))
}

// stateRetention: with StateRetention the state of a drained group
// is kept (and found by the group's next messages, until their first
// state write replaces it) and gone once the retention ends; without it,
// it goes with the group row.
func stateRetention(is *is.I, e *env) {
	x := e.exactly()
	settle := func(l *pgtransport.Lease, state string) {
		e.t.Helper()
		tx := e.begin(l.Group)
		is.NoErr(x.AckStateTx(e.ctx(), tx, l, []byte(state)))
		is.NoErr(tx.Commit(e.ctx()))
	}
	e.publish("none", "none-0", 0)
	settle(e.claim("w", 0), "n")
	is.Equal(e.state("none"), nil) // no retention (a new queue's)

	e.with(pgtransport.Config{Policy: &pgtransport.Policy{StateRetention: time.Second}}) // the queue's, for every transport
	e.publish("g", "g-0", 0)
	settle(e.claim("w", 0), "s0")
	m, g := e.rows()
	is.Equal(m+g, 0)                     // drained: the row is gone
	is.Equal(string(e.state("g")), "s0") // and the state kept

	e.publish("g", "g-1", 0) // back: a fresh row finds the kept state
	l := e.claim("w", 0)
	tx := e.begin("g")
	got, err := x.StateTx(e.ctx(), tx, "g")
	is.NoErr(err)
	is.Equal(string(got), "s0")
	is.NoErr(x.AckStateTx(e.ctx(), tx, l, []byte("s1")))
	is.NoErr(tx.Commit(e.ctx()))
	is.Equal(string(e.state("g")), "s1") // the new state, kept in turn

	e.until("the kept state expires", func() bool { return e.state("g") == nil })
	is.Equal(e.count(`SELECT count(*) FROM transport_kept_states WHERE keep_until > extract(epoch FROM clock_timestamp())`), 0)
}

// statePlainSQL: the state a plain-SQL client reads (harel_state)
// is the one the Go call reads.
func statePlainSQL(is *is.I, e *env) {
	x := e.exactly()
	e.publish("g", "g-0", 0)
	e.publish("g", "g-1", 0)
	l := e.claim("w", 0)
	want := []byte{0, 1, 2, 0xff, 'x'}
	tx := e.begin("g")
	is.NoErr(x.AckStateTx(e.ctx(), tx, l, want))
	is.NoErr(tx.Commit(e.ctx()))
	var plain []byte
	is.NoErr(e.poolAt("g").QueryRow(e.ctx(), `SELECT harel_state($1)`, "g").Scan(&plain))
	is.True(bytes.Equal(plain, want))
	is.True(bytes.Equal(e.state("g"), want))
	var none []byte
	is.NoErr(e.poolAt("nobody").QueryRow(e.ctx(), `SELECT harel_state($1)`, "nobody").Scan(&none))
	is.Equal(none, nil)
	is.Equal(e.state("nobody"), nil)
}

// workTxFoldsInOrder: WorkTx applies each message once, in order
// per group, its state the fold of the group's events; a handler error
// rolls its writes back and fails the attempt, which is retried.
func workTxFoldsInOrder(is *is.I, e *env) {
	x := e.exactly()
	e.effects()
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{RetryBackoffMin: time.Millisecond, RetryBackoffMax: time.Millisecond, StateRetention: time.Hour}})
	const groups, per = 3, 5
	for i := range per {
		for g := range groups {
			e.publish(fmt.Sprint("acct-", g), strconv.Itoa(10*g+i), 0)
		}
	}
	var failed atomic.Bool
	ctx, cancel := context.WithCancel(e.ctx())
	defer cancel()
	errs := make(chan error, 1)
	go func() {
		errs <- x.WorkTx(ctx, pgtransport.WorkerConfig{WorkerID: "tx", Concurrency: 2, ShutdownTimeout: time.Second},
			func(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease, state []byte) ([]byte, error) {
				// Qualified: through a transaction-mode pooler the
				// transport's connections carry no search_path.
				if _, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{e.schema, "effects"}.Sanitize()+` (group_id, seq) VALUES ($1, $2)`, l.Group, l.Seq); err != nil {
					return nil, err
				}
				if l.Group == "acct-1" && failed.CompareAndSwap(false, true) {
					return nil, errors.New("once")
				}
				sum, _ := strconv.Atoi(string(state))
				n, err := strconv.Atoi(l.Event)
				if err != nil {
					return nil, err
				}
				return []byte(strconv.Itoa(sum + n)), nil
			})
	}()
	e.until("every message is handled", func() bool {
		e.clock.Advance(10 * time.Millisecond) // the case's clock: the failed attempt's backoff ends
		return e.count(`SELECT count(*) FROM transport_messages`) == 0
	})
	cancel()
	is.NoErr(<-errs)
	is.Equal(e.count(`SELECT count(*) FROM effects`), groups*per)                                                                                                    // each once: the failed attempt's write rolled back
	is.Equal(e.count(`SELECT count(*) FROM (SELECT group_id, seq, id < lag(id) OVER (PARTITION BY group_id ORDER BY seq) AS back FROM effects) AS x WHERE back`), 0) // in order
	is.True(failed.Load())
	for g := range groups {
		sum := 0
		for i := range per {
			sum += 10*g + i
		}
		is.Equal(string(e.state(fmt.Sprint("acct-", g))), strconv.Itoa(sum)) // the fold, kept after the drain
	}
}

// workTxDeadLetterNowCommitsNothing: a transactional handler that writes
// an effect and a new state, then returns DeadLetterNow(err), has neither
// committed (its transaction is rolled back) and its message dead-lettered
// at once with err as the cause; one that returns Snooze is handed the
// same message again, uncounted, with the state it had. The group goes on
// in order, and the next message sees only committed state.
func workTxDeadLetterNowCommitsNothing(is *is.I, e *env) {
	x := e.exactly()
	e.effects()
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 5, StateRetention: time.Hour}})
	e.publish("acct", "1", 0)
	e.publish("acct", "bad", 0)
	e.publish("acct", "later", 0)
	e.publish("acct", "2", 0)
	var snoozed atomic.Bool
	attempts := make(chan int, 8)
	ctx, cancel := context.WithCancel(e.ctx())
	defer cancel()
	errs := make(chan error, 1)
	go func() {
		errs <- x.WorkTx(ctx, pgtransport.WorkerConfig{WorkerID: "tx", Concurrency: 1, ShutdownTimeout: time.Second},
			func(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease, state []byte) ([]byte, error) {
				if _, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{e.schema, "effects"}.Sanitize()+` (group_id, seq) VALUES ($1, $2)`, l.Group, l.Seq); err != nil {
					return nil, err
				}
				sum, _ := strconv.Atoi(string(state))
				switch {
				case l.Event == "bad":
					return []byte("poisoned"), pgtransport.DeadLetterNow(errors.New("cannot parse"))
				case l.Event == "later":
					attempts <- l.Attempt
					if snoozed.CompareAndSwap(false, true) {
						return []byte("poisoned"), pgtransport.Snooze(0)
					}
					return state, nil
				}
				n, _ := strconv.Atoi(l.Event)
				return []byte(strconv.Itoa(sum + n)), nil
			})
	}()
	e.until("every message is handled", func() bool { return e.count(`SELECT count(*) FROM transport_messages`) == 0 })
	cancel()
	is.NoErr(<-errs)
	is.Equal(e.count(`SELECT count(*) FROM effects`), 3) // 1, later and 2: the buried and the snoozed attempts' writes rolled back
	is.Equal(e.count(`SELECT count(*) FROM effects WHERE seq IN (SELECT seq FROM transport_dead_letters)`), 0)
	is.Equal(string(e.state("acct")), "3") // 1 + 2: neither "poisoned" state committed
	ds := e.deadLetters(pgtransport.DeadLetterQuery{})
	is.Equal(len(ds), 1)
	is.Equal(ds[0].Event, "bad")
	is.Equal(ds[0].LastError, "cannot parse")
	is.Equal(ds[0].Attempts, 1)
	is.Equal(<-attempts, 1) // the snoozed hand-out
	is.Equal(<-attempts, 1) // and the next: uncounted
}

// workTxFailedCommitHoldsNothing: a handler's transaction whose
// commit fails (a deferred foreign key) applies none of its writes, fails
// the attempt, and leaves no group held: the blocking runtime claims the
// slot's next lease inside that transaction, and the other group must
// still be handed out at once, not after a lease that never committed
// lapses (the case's clock stays far short of the visibility).
func workTxFailedCommitHoldsNothing(is *is.I, e *env) {
	x := e.exactly()
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{RetryBackoffMin: time.Millisecond, RetryBackoffMax: time.Millisecond}})
	e.exec(`
		CREATE TABLE parents (id INT PRIMARY KEY);
		INSERT INTO parents VALUES (0);
		CREATE TABLE children (id BIGSERIAL PRIMARY KEY, group_id TEXT NOT NULL, attempt INT NOT NULL,
		                       parent INT NOT NULL REFERENCES parents DEFERRABLE INITIALLY DEFERRED)`)
	children := pgx.Identifier{e.schema, "children"}.Sanitize()
	// Never-served groups go in arrival order: a, then b; on partitions
	// the two share one, so that one slot of one runtime has both.
	gs := e.local("a", "b")
	a, b := gs[0], gs[1]
	e.publish(a, "first", 0)
	e.publish(b, "second", 0)
	ctx, cancel := context.WithCancel(e.ctx())
	defer cancel()
	errs := make(chan error, 1)
	go func() {
		errs <- x.WorkTx(ctx, pgtransport.WorkerConfig{WorkerID: "tx", Concurrency: 1, Visibility: time.Minute, ShutdownTimeout: time.Second},
			func(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease, state []byte) ([]byte, error) {
				parent := 0
				if l.Group == a && l.Attempt == 1 {
					parent = 1 // no such parent: the commit fails
				}
				_, err := tx.Exec(ctx, `INSERT INTO `+children+` (group_id, attempt, parent) VALUES ($1, $2, $3)`, l.Group, l.Attempt, parent)
				return state, err
			})
	}()
	advanced := time.Duration(0)
	e.until("both messages are handled", func() bool {
		e.clock.Advance(10 * time.Millisecond) // a's retry backoff ends; no lease lapses
		advanced += 10 * time.Millisecond
		return e.count(`SELECT count(*) FROM transport_messages`) == 0
	})
	cancel()
	is.NoErr(<-errs)
	is.True(advanced < time.Minute)                                                              // nothing waited for a lease to lapse
	is.Equal(e.count(`SELECT count(*) FROM children`), 2)                                        // the failed commit's row is not there
	is.Equal(e.count(`SELECT count(*) FROM children WHERE group_id = $1 AND attempt = 2`, a), 1) // a's retry, after the failed attempt
	is.Equal(e.count(`SELECT count(*) FROM children WHERE group_id = $1 AND attempt = 1`, b), 1) // b, handed out once
}

// refusesBadInput: each exactly-once call refuses bad input with
// its sentinel before anything is written: a group id that is empty or
// holds a NUL byte, a nil transaction or lease, a nil handler, a
// cancelled ctx; the lease still holds its message after each.
func refusesBadInput(is *is.I, e *env) {
	x := e.exactly()
	e.publish("g", "e", 0)
	l := e.claim("w", 0)
	for _, group := range []string{"", "a\x00b"} {
		_, err := x.State(e.ctx(), group)
		is.True(errors.Is(err, pgtransport.ErrInvalidGroup)) // State
	}
	_, err := x.StateTx(e.ctx(), nil, "g")
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig))                                                // StateTx without a transaction
	is.True(errors.Is(x.AckTx(e.ctx(), nil, l), pgtransport.ErrInvalidConfig))                           // AckTx without a transaction
	is.True(errors.Is(x.AckStateTx(e.ctx(), nil, l, nil), pgtransport.ErrInvalidConfig))                 // AckStateTx without a transaction
	is.True(errors.Is(x.WorkTx(e.ctx(), pgtransport.WorkerConfig{}, nil), pgtransport.ErrInvalidConfig)) // WorkTx without a handler

	tx := e.begin("g")
	is.True(errors.Is(x.AckTx(e.ctx(), tx, nil), pgtransport.ErrNilLease)) // no lease
	done, cancel := context.WithCancel(e.ctx())
	cancel()
	is.True(errors.Is(x.AckStateTx(done, tx, l, []byte("s")), context.Canceled)) // a cancelled ctx
	_, err = x.StateTx(done, tx, "g")
	is.True(errors.Is(err, context.Canceled))
	is.NoErr(tx.Rollback(e.ctx()))

	is.Equal(e.count(`SELECT count(*) FROM transport_messages WHERE group_id = 'g'`), 1) // nothing written
	is.Equal(e.state("g"), nil)
	e.ack(l) // the lease still holds
}
