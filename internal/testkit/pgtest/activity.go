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
	waitParked(tb, db.Conn(tb), db.Schema, nil)
}

// WaitParked is DB.WaitParked for a ClaimWait over p's partitions, which
// parks on every partition: it waits until each partition's database has
// a connection parked so.
func (p *Partitioned) WaitParked(tb testing.TB) {
	tb.Helper()
	names := make([]string, len(p.Parts))
	for i, part := range p.Parts {
		names[i] = part.Config().ConnConfig.Database
	}
	cfg, err := pgx.ParseConfig(p.PartDSNs[0])
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	cfg.RuntimeParams["application_name"] = appName(owner)
	watch, err := pgx.ConnectConfig(Context(tb), cfg)
	if err != nil {
		tb.Fatalf("pgtest: connect: %v", err)
	}
	defer watch.Close(Context(tb))
	waitParked(tb, watch, p.Schema, names)
}

// waitParked waits, watching from watch, until a connection of each
// database in dbs (nil: any one connection) is parked in a ClaimWait on
// schema (pg_stat_activity shows the whole server).
func waitParked(tb testing.TB, watch *pgx.Conn, schema string, dbs []string) {
	tb.Helper()
	wait := pgx.Identifier{schema}.Sanitize() + ".harel_wait("
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var parked int
		err := watch.QueryRow(Context(tb), `SELECT count(DISTINCT datname) FROM pg_stat_activity
			WHERE state = 'idle' AND strpos(query, $1) > 0 AND ($2::text[] IS NULL OR datname = ANY ($2))`, wait, dbs).Scan(&parked)
		if err != nil {
			tb.Fatalf("pg_stat_activity: %v", err)
		}
		if parked >= max(len(dbs), 1) {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("no ClaimWait parked within 30s (%d of %d databases)", parked, max(len(dbs), 1))
		}
	}
}
