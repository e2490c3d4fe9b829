package sync_test

import (
	"cmp"
	"context"
	"errors"
	"path"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/internal/pooler"
	"github.com/pgtransport/pgtransport/internal/testkit/contract"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// TestContractPgBouncer runs the contract through PgBouncer in transaction
// pooling mode (BouncerPoolSize server connections), pgx in
// cache_describe mode: every transport a case opens on a pool of the test
// server gets one through pgbouncer instead (a Proxy's pool stays as it
// is); the case's own look at the tables goes straight to the server. The
// cases that repeat a server-side race thousands of times (bouncerSkips)
// are left to TestContract: they add a minute here and test the
// functions' locking, which no connection path changes.
func TestContractPgBouncer(t *testing.T) {
	b := pgtest.Bouncer(t)
	contract.Run(t, contract.Opener{DB: func(t *testing.T, db core.DBTX, cfg pgtransport.Config) (contract.Transport, error) {
		bouncerSkip(t)
		if pool, ok := db.(*pgxpool.Pool); ok {
			db = b.Reroute(t, pool, "cache_describe")
		}
		return openDB(t, db, cfg)
	}}) // one database: PgBouncer stands in front of one
}

// TestPoolerExecModes: FromDSN through a transaction pooler refuses pgx's
// modes that keep session state, with ErrPoolerExecMode, and works in the
// others; Config.Pooling overrides the detection both ways.
func TestPoolerExecModes(t *testing.T) {
	t.Parallel()
	b := pgtest.Bouncer(t)
	db := pgtest.New(t, 2)
	try := func(dsn string, cfg pgtransport.Config) error {
		cfg.Schema, cfg.MaxConnectWait = db.Schema, 10*time.Second
		tr, err := pgsync.FromDSN(ctx(t), dsn, cfg)
		if err != nil {
			return err
		}
		defer tr.Close()
		if _, err := tr.Publish(ctx(t), "g", "e", 0); err != nil {
			return err
		}
		l, err := tr.ClaimWait(ctx(t), "w", time.Minute, 0)
		if err != nil {
			return err
		}
		return tr.Ack(ctx(t), l)
	}
	for _, mode := range []string{"", "cache_statement", "describe_exec"} {
		t.Run("Refuses/"+cmp.Or(mode, "default"), func(t *testing.T) {
			is := is.New(t)
			err := try(b.DSN(mode), pgtransport.Config{})
			is.True(errors.Is(err, pgtransport.ErrPoolerExecMode)) // refused on open
		})
	}
	for _, mode := range []string{"exec", "cache_describe", "simple_protocol"} {
		t.Run("Works/"+mode, func(t *testing.T) {
			is := is.New(t)
			is.NoErr(try(b.DSN(mode), pgtransport.Config{})) // publish, claim, ack through pgbouncer
		})
	}
	t.Run("PoolingSessionTrusted", func(t *testing.T) {
		// The same DSN Refuses/default is refused with, but the caller
		// says the sessions are kept: not checked. (The caller is wrong
		// here, so the open may still fail, on a statement another client
		// prepared on the same server connection: "already exists".)
		is := is.New(t)
		tr, err := pgsync.FromDSN(ctx(t), b.DSN(""), pgtransport.Config{Schema: db.Schema, Pooling: pgtransport.PoolingSession})
		is.True(!errors.Is(err, pgtransport.ErrPoolerExecMode)) // not refused
		if err == nil {
			tr.Close()
		}
	})
	t.Run("PoolingTransactionSaid", func(t *testing.T) {
		is := is.New(t)
		err := try(db.DSN, pgtransport.Config{Pooling: pgtransport.PoolingTransaction})
		is.True(errors.Is(err, pgtransport.ErrPoolerExecMode)) // no pooler seen, but the caller said so
	})
	t.Run("DirectDetectedAsDirect", func(t *testing.T) {
		is := is.New(t)
		is.NoErr(try(db.DSN, pgtransport.Config{})) // pgx's default mode, straight to the server
	})
	t.Run("UnknownPooling", func(t *testing.T) {
		is := is.New(t)
		_, err := pgsync.FromDSN(ctx(t), db.DSN, pgtransport.Config{Schema: db.Schema, Pooling: "statement"})
		is.True(errors.Is(err, pgtransport.ErrInvalidConfig))
	})
}

// TestThroughPooler: the detection itself, on a connection through
// pgbouncer and on one straight to the server.
func TestThroughPooler(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	b := pgtest.Bouncer(t)
	db := pgtest.New(t, 2)
	for _, c := range []struct {
		pool   *pgxpool.Pool
		pooled bool
	}{{b.Pool(t, 1, "exec", ""), true}, {db.Pool, false}} {
		conn, err := c.pool.Acquire(context.Background())
		is.NoErr(err)
		got, err := pooler.Through(ctx(t), conn.Conn())
		conn.Release()
		is.NoErr(err)
		is.Equal(got, c.pooled) // pgbouncer's own cancel key gives it away
	}
}

// bouncerSkips are the contract cases TestContractPgBouncer leaves to
// TestContract.
var bouncerSkips = []string{"LostPublishRace", "LostPublishRaceBatchAck", "RedriveRacesPublishAndDrain"}

// bouncerSkip skips t if it is one of bouncerSkips.
func bouncerSkip(t *testing.T) {
	t.Helper()
	if slices.Contains(bouncerSkips, path.Base(t.Name())) {
		t.Skip("a server-side race repeated thousands of times: TestContract runs it")
	}
}
