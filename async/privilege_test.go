package async_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// TestLeastPrivilegeRole: a role given only schema.Grants, opening its
// transports with SkipApply (no DDL on open), can do all a worker and an
// operator does, blocking and async: publish, claim, settle, stream, the
// handler runtime with its heartbeats, fails and dead letters, the
// transactional runtime with the group's state kept after a drain, and the
// operator's reads, pause, purge and redrive. It cannot change the queue's
// tables or functions (the owner applies the schema).
func TestLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	cfg := pgtransport.Config{Schema: db.Schema}
	_, err := pgsync.New(ctx(t), db.Pool, cfg) // the owner applies the schema
	is.NoErr(err)
	role := "w_" + db.Schema
	_, err = db.Pool.Exec(ctx(t), `CREATE ROLE `+pgx.Identifier{role}.Sanitize()+` LOGIN`)
	is.NoErr(err)
	t.Cleanup(func() {
		for _, q := range []string{`DROP OWNED BY `, `DROP ROLE `} {
			if _, err := db.Pool.Exec(ctx(t), q+pgx.Identifier{role}.Sanitize()); err != nil {
				t.Errorf("%s%s: %v", q, role, err)
			}
		}
	})
	grants, err := schema.Grants(db.Schema, role)
	is.NoErr(err)
	_, err = db.Pool.Exec(ctx(t), grants)
	is.NoErr(err)

	pcfg, err := pgxpool.ParseConfig(db.DSN)
	is.NoErr(err)
	pcfg.ConnConfig.User = role
	pcfg.ConnConfig.RuntimeParams["search_path"] = db.Schema
	pool, err := pgxpool.NewWithConfig(ctx(t), pcfg)
	is.NoErr(err)
	t.Cleanup(pool.Close)
	var who string
	is.NoErr(pool.QueryRow(ctx(t), `SELECT current_user`).Scan(&who))
	is.Equal(who, role) // really the worker role

	worker := pgtransport.Config{Schema: db.Schema, SkipApply: true}
	st, err := pgsync.New(ctx(t), pool, worker)
	is.NoErr(err)
	_, err = st.Publish(ctx(t), "g", "e1", 0)
	is.NoErr(err)
	_, err = st.PublishMany(ctx(t), []pgtransport.Message{{Group: "g", Event: "e2"}, {Group: "h", Event: "h1"}})
	is.NoErr(err)
	l, err := st.Claim(ctx(t), "w", time.Minute, 0)
	is.NoErr(err)
	is.NoErr(st.Extend(ctx(t), l, time.Minute))
	next, err := st.AckNext(ctx(t), l, time.Minute)
	is.NoErr(err)
	is.Equal(next.Event, "e2")
	is.NoErr(st.Nack(ctx(t), next, 0))
	ls, err := st.ClaimMany(ctx(t), "w", time.Minute, 0, 10)
	is.NoErr(err)
	errs, err := st.AckMany(ctx(t), ls)
	is.NoErr(err)
	is.Equal(errs, []error{nil, nil})

	at := open(t, pool, worker) // async: its stream writes waiter rows and listens
	s := stream(t, at, async.StreamConfig{})
	waitArmed(t, db, 1)
	_, err = st.Publish(ctx(t), "late", "x", 0)
	is.NoErr(err)
	got := receive(t, s, 10*time.Second)
	is.Equal(got.Event, "x")
	is.NoErr(<-at.Ack(ctx(t), got))
	s.Close()

	// The handler runtime, on both front-ends: acks, and a fail that
	// dead-letters (the policy, one attempt, set by the owner: a worker
	// may read it, not change it).
	_, err = db.Pool.Exec(ctx(t), `UPDATE `+pgx.Identifier{db.Schema, "transport_policy"}.Sanitize()+` SET max_attempts = 1`)
	is.NoErr(err)
	for _, w := range []struct {
		name string
		work func(context.Context, pgtransport.WorkerConfig, pgtransport.Handler) error
	}{{"sync", st.Work}, {"async", at.Work}} {
		_, err = st.PublishMany(ctx(t), []pgtransport.Message{{Group: w.name, Event: "ok"}, {Group: w.name, Event: "bad"}})
		is.NoErr(err)
		wctx, stop := context.WithCancel(ctx(t))
		var handled atomic.Int32
		err = w.work(wctx, pgtransport.WorkerConfig{WorkerID: w.name, Concurrency: 2, Visibility: 5 * time.Second},
			func(_ context.Context, l *pgtransport.Lease) error {
				if handled.Add(1) == 2 {
					defer stop()
				}
				if l.Event == "bad" {
					return errors.New("bad event")
				}
				return nil
			})
		is.NoErr(err) // the run ended with its ctx
		is.Equal(handled.Load(), int32(2))
	}

	// The transactional runtime, on both front-ends: the state saved with
	// the ack, and kept (a write to transport_kept_states, by the trigger)
	// when the group drains, for the retention the owner set.
	_, err = db.Pool.Exec(ctx(t), `UPDATE `+pgx.Identifier{db.Schema, "transport_policy"}.Sanitize()+` SET state_retention = 60`)
	is.NoErr(err)
	for _, w := range []struct {
		name string
		work func(context.Context, pgtransport.WorkerConfig, pgtransport.TxHandler) error
	}{{"sync-tx", st.WorkTx}, {"async-tx", at.WorkTx}} {
		_, err = st.Publish(ctx(t), w.name, "s1", 0)
		is.NoErr(err)
		wctx, stop := context.WithCancel(ctx(t))
		err = w.work(wctx, pgtransport.WorkerConfig{WorkerID: w.name, Concurrency: 2, Visibility: 5 * time.Second},
			func(_ context.Context, _ pgx.Tx, l *pgtransport.Lease, _ []byte) ([]byte, error) {
				defer stop()
				return []byte(l.Event), nil
			})
		is.NoErr(err) // the run ended with its ctx
		state, err := st.State(ctx(t), w.name)
		is.NoErr(err)
		is.Equal(string(state), "s1") // saved, and kept after the drain
	}

	// The operator's calls.
	stats, err := st.Stats(ctx(t))
	is.NoErr(err)
	is.Equal(stats.Total.DeadLetters, int64(2)) // one per runtime
	_, err = st.Publish(ctx(t), "op", "1", 0)
	is.NoErr(err)
	_, err = st.Groups(ctx(t), pgtransport.GroupQuery{Order: pgtransport.OldestHead})
	is.NoErr(err)
	_, err = st.Peek(ctx(t), "op", 10)
	is.NoErr(err)
	is.NoErr(st.PauseGroup(ctx(t), "op"))
	is.NoErr(st.ResumeGroup(ctx(t), "op"))
	n, err := st.PurgeGroup(ctx(t), "op", 0)
	is.NoErr(err)
	is.Equal(n, int64(1))
	dead, err := st.DeadLetters(ctx(t), pgtransport.DeadLetterQuery{})
	is.NoErr(err)
	is.Equal(len(dead), 2)
	redriven, err := st.Redrive(ctx(t), pgtransport.DeadLetterFilter{Seqs: []int64{dead[0].Seq}})
	is.NoErr(err)
	is.Equal(redriven, int64(1))
	purged, err := st.PurgeDeadLetters(ctx(t), pgtransport.DeadLetterFilter{})
	is.NoErr(err)
	is.Equal(purged, int64(1))

	for _, q := range []string{
		`CREATE OR REPLACE FUNCTION harel_claim(p_now float8, p_lease float8, p_token text, p_min_priority int DEFAULT 0)
		 RETURNS TABLE (group_id text, seq bigint, event text) LANGUAGE sql AS 'SELECT NULL::text, NULL::bigint, NULL::text'`,
		`DROP TABLE transport_messages`,
		`ALTER TABLE transport_groups ADD COLUMN x int`,
		`TRUNCATE transport_messages`,
		`DROP TRIGGER transport_messages_hold_group ON transport_messages`,
		`CREATE TABLE ` + pgx.Identifier{db.Schema}.Sanitize() + `.planted (x int)`,
	} {
		_, err := pool.Exec(ctx(t), q)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" { // insufficient_privilege
			t.Errorf("%s: got %v, want permission denied", q, err)
		}
	}
}

func TestGrantsBadInput(t *testing.T) {
	is := is.New(t)
	_, err := schema.Grants("s", "")
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // a role is required
	_, err = schema.Grants("pg_catalog", "w")
	is.True(errors.Is(err, pgtransport.ErrInvalidSchema))
	_, err = schema.Grants("s", "w\x00")
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig))
	sql, err := schema.Grants("s", `w"; DROP TABLE x; --`)
	is.NoErr(err)
	is.True(strings.Contains(sql, `TO "w""; DROP TABLE x; --"`)) // quoted, never executed as written
}

// TestOpenNamesTheFix: what a worker role meets on open says what to do.
// Opening without SkipApply on an up-to-date schema works (Apply reads
// the version before it creates anything); on a schema the role would
// have to change, the refusal says to apply it as the owner and open
// workers with SkipApply. With SkipApply on a schema never applied, both
// transports refuse at open alike (ErrSchemaMissing, naming the command),
// not at their first call. A Config.Policy the role may not write says
// to set it as the owner.
func TestOpenNamesTheFix(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 4)
	role := "w_" + db.Schema
	_, err := db.Pool.Exec(ctx(t), `CREATE ROLE `+pgx.Identifier{role}.Sanitize()+` LOGIN`)
	is.NoErr(err)
	t.Cleanup(func() {
		for _, q := range []string{`DROP OWNED BY `, `DROP ROLE `} {
			if _, err := db.Pool.Exec(ctx(t), q+pgx.Identifier{role}.Sanitize()); err != nil {
				t.Errorf("%s%s: %v", q, role, err)
			}
		}
	})
	pcfg, err := pgxpool.ParseConfig(db.DSN)
	is.NoErr(err)
	pcfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx(t), pcfg)
	is.NoErr(err)
	t.Cleanup(pool.Close)

	missing := pgtransport.Config{Schema: db.Schema + "_none", SkipApply: true}
	_, err = pgsync.New(ctx(t), pool, missing)
	is.True(errors.Is(err, pgtransport.ErrSchemaMissing))               // sync refuses at open
	is.True(strings.Contains(err.Error(), "pgtransport migrate apply")) // naming the command
	_, err = async.New(ctx(t), pool, missing)
	is.True(errors.Is(err, pgtransport.ErrSchemaMissing))               // async alike
	is.True(strings.Contains(err.Error(), "pgtransport migrate apply")) // with the same words
	is.True(!strings.Contains(err.Error(), "channel"))                  // not an internal step's name

	_, err = pgsync.New(ctx(t), pool, pgtransport.Config{Schema: db.Schema + "_none"}) // it would create the schema
	var pgErr *pgconn.PgError
	is.True(errors.As(err, &pgErr) && pgErr.Code == "42501")                // the server's refusal
	is.True(strings.Contains(err.Error(), "apply it as the queue's owner")) // what to do
	is.True(strings.Contains(err.Error(), "open workers with Config.SkipApply"))

	_, err = pgsync.New(ctx(t), db.Pool, pgtransport.Config{Schema: db.Schema}) // the owner applies it
	is.NoErr(err)
	grants, err := schema.Grants(db.Schema, role)
	is.NoErr(err)
	_, err = db.Pool.Exec(ctx(t), grants)
	is.NoErr(err)
	tr, err := pgsync.New(ctx(t), pool, pgtransport.Config{Schema: db.Schema}) // up to date: nothing to change
	is.NoErr(err)
	_, err = tr.Publish(ctx(t), "g", "e", 0)
	is.NoErr(err) // and it works

	_, err = pgsync.New(ctx(t), pool, pgtransport.Config{Schema: db.Schema, SkipApply: true, Policy: &pgtransport.Policy{MaxAttempts: 3}})
	is.True(errors.As(err, &pgErr) && pgErr.Code == "42501")              // may not write the policy
	is.True(strings.Contains(err.Error(), "set it as the queue's owner")) // what to do
	is.True(strings.Contains(err.Error(), "leave Config.Policy nil in workers"))
}
