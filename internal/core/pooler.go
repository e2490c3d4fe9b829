package core

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/pooler"
)

// CheckPooling decides, by cfg.Pooling, whether db's connections go through
// a transaction pooler, and refuses then a query exec mode that keeps state
// in the server session (pgtransport.ErrPoolerExecMode). With
// PoolingDetect it asks one connection (see pooler.Through); a DBTX it
// cannot take a connection from counts as direct. A pooled transport must
// not LISTEN on its pool (the caller's part).
func CheckPooling(ctx context.Context, db DBTX, cfg pgtransport.Config) (pooled bool, err error) {
	switch cfg.Pooling {
	case pgtransport.PoolingSession:
		return false, nil
	case pgtransport.PoolingDetect, pgtransport.PoolingTransaction:
	default:
		return false, fmt.Errorf("%w: Pooling %q, want %q, %q or %q", pgtransport.ErrInvalidConfig,
			cfg.Pooling, pgtransport.PoolingDetect, pgtransport.PoolingSession, pgtransport.PoolingTransaction)
	}
	conn, done, err := connOf(ctx, db)
	if err != nil {
		return false, mapErr("detect pooler", err)
	}
	if conn == nil {
		return cfg.Pooling == pgtransport.PoolingTransaction, nil
	}
	defer done()
	pooled = cfg.Pooling == pgtransport.PoolingTransaction
	if !pooled {
		if pooled, err = pooler.Through(ctx, conn); err != nil {
			return false, mapErr("detect pooler", err)
		}
	}
	if mode := conn.Config().DefaultQueryExecMode; pooled && !PoolerSafe(mode) {
		how := "a pooler detected: the server's process id differs from the one reported at connect"
		if cfg.Pooling == pgtransport.PoolingTransaction {
			how = "Config.Pooling says so"
		}
		return true, fmt.Errorf("%w: pgx's %s mode (%s); add default_query_exec_mode=exec (or cache_describe) to the DSN, or set pgx.ConnConfig.DefaultQueryExecMode; if the pooler keeps sessions, set Config.Pooling to PoolingSession",
			pgtransport.ErrPoolerExecMode, mode, how)
	}
	return pooled, nil
}

// PoolerSafe reports whether mode runs every statement within one
// protocol Sync and leaves nothing named behind in the server session:
// exec (an unnamed statement), cache_describe (cached descriptions only,
// kept by the client) and simple_protocol. cache_statement prepares named
// statements, which a transaction pooler's next server connection does not
// have (or has from another client: "prepared statement already exists");
// describe_exec parses in one Sync and executes in another, which the
// pooler may send to different server connections.
func PoolerSafe(mode pgx.QueryExecMode) bool {
	switch mode {
	case pgx.QueryExecModeExec, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeSimpleProtocol:
		return true
	}
	return false
}

// connOf returns a connection of db to ask, and what gives it back; nil
// for a DBTX it cannot take one from.
func connOf(ctx context.Context, db DBTX) (*pgx.Conn, func(), error) {
	switch d := db.(type) {
	case *pgxpool.Pool:
		c, err := d.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		return c.Conn(), c.Release, nil
	case *pgx.Conn:
		return d, func() {}, nil
	case pgx.Tx:
		return d.Conn(), func() {}, nil
	}
	return nil, nil, nil
}
