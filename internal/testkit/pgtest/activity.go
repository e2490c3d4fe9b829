package pgtest

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// WaitParked waits until a ClaimWait call on the schema has found nothing
// and parked: its connection has finished the wait statement that
// follows its empty claim (the ticket that a publish or Close wakes is taken
// before that claim). It watches from a connection of its own, so that no
// query of its own replaces a pool connection's last statement in
// pg_stat_activity, and fails the test after 30 s.
func (db *DB) WaitParked(tb testing.TB) {
	tb.Helper()
	watch := db.Conn(tb)
	wait := pgx.Identifier{db.Schema}.Sanitize() + ".harel_wait("
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var parked bool
		err := watch.QueryRow(Context(tb), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE state = 'idle' AND strpos(query, $1) > 0)`, wait).Scan(&parked)
		if err != nil {
			tb.Fatalf("pg_stat_activity: %v", err)
		}
		if parked {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatal("no ClaimWait parked within 30s")
		}
	}
}
