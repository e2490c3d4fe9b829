// Package pooler tells whether a connection reaches PostgreSQL through a
// connection pooler: the one check the transports (on open) and the
// listener (at each connect) share.
package pooler

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Through reports whether conn reaches PostgreSQL through a pooler:
// whether the process id the server reported when conn connected (the
// protocol's BackendKeyData; pgx's PgConn().PID()) differs from
// pg_backend_pid(). PostgreSQL reports its own process; PgBouncer, in
// every pool mode, sends a cancel key of its own making; RDS Proxy sends
// none (0). A pooler that passes the server's key through is not seen.
// The query goes by the simple protocol, which prepares nothing.
func Through(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var pid uint32
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`, pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
		return false, err
	}
	return pid != conn.PgConn().PID(), nil
}
