package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// owner names this process on the server: every connection pgtest opens
// carries it in its application_name, and every schema pgtest creates
// records it in its comment. A schema whose owner has no connection left was
// left behind by a process that is gone.
var owner = func() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

// appName is the application_name of owner's connections.
func appName(owner string) string { return "pgtest " + owner }

// staleAfter is how old a schema of a vanished owner must be before a sweep
// drops it. The owner check keeps a running process's schemas safe; the
// age covers the moments a live process has no connection at all (its pool
// between connections, a server restart).
const staleAfter = time.Hour

var (
	schemaName = regexp.MustCompile(`^t_[0-9a-f]{12}$`)
	stampRE    = regexp.MustCompile(`^pgtest owner=([0-9a-f]+) created=([0-9]+)$`)
)

// stamp is the schema comment that records owner and creation time.
func stamp(owner string, created time.Time) string {
	return fmt.Sprintf("pgtest owner=%s created=%d", owner, created.Unix())
}

// createSchema creates the schema name stamped with owner and created. One
// simple-protocol query runs both statements in one transaction, so no
// sweep ever sees the schema unstamped. COMMENT takes a literal, not a
// parameter; the stamp holds only letters, digits, spaces and "=".
func createSchema(ctx context.Context, db *pgxpool.Pool, name, owner string, created time.Time) error {
	id := pgx.Identifier{name}.Sanitize()
	_, err := db.Exec(ctx, "CREATE SCHEMA "+id+"; COMMENT ON SCHEMA "+id+" IS '"+stamp(owner, created)+"'")
	return err
}

// sweep drops the test schemas that processes killed before their cleanup
// ran (a fuzzing worker, a test binary hit by a timeout) left behind: those
// named t_<12 hex digits>, stamped by pgtest, created more than staleAfter
// before now, whose owner has no connection on the server. A schema without
// a stamp (made by an older pgtest, or by someone else) is never touched.
// It returns the schemas it dropped; a drop that fails is left for the
// next sweep and reported in err.
func sweep(ctx context.Context, db *pgxpool.Pool, now time.Time) (dropped []string, err error) {
	rows, err := db.Query(ctx, `SELECT nspname, COALESCE(obj_description(oid, 'pg_namespace'), '') FROM pg_namespace WHERE nspname LIKE 't\_%'`)
	if err != nil {
		return nil, fmt.Errorf("sweep: %w", err)
	}
	type stale struct{ name, owner string }
	var candidates []stale
	for rows.Next() {
		var name, note string
		if err := rows.Scan(&name, &note); err != nil {
			rows.Close()
			return nil, fmt.Errorf("sweep: %w", err)
		}
		m := stampRE.FindStringSubmatch(note)
		if !schemaName.MatchString(name) || m == nil {
			continue
		}
		created, err := strconv.ParseInt(m[2], 10, 64)
		if err != nil || now.Sub(time.Unix(created, 0)) < staleAfter {
			continue
		}
		candidates = append(candidates, stale{name, m[1]})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sweep: %w", err)
	}
	if len(candidates) == 0 {
		return nil, nil
	}
	// Read the live owners after the candidates: an owner that is live now
	// keeps its schemas, and one that is not can create none of them again.
	live := map[string]bool{}
	rows, err = db.Query(ctx, `SELECT DISTINCT application_name FROM pg_stat_activity WHERE application_name LIKE 'pgtest %'`)
	if err != nil {
		return nil, fmt.Errorf("sweep: %w", err)
	}
	for rows.Next() {
		var app string
		if err := rows.Scan(&app); err != nil {
			rows.Close()
			return nil, fmt.Errorf("sweep: %w", err)
		}
		live[app] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sweep: %w", err)
	}
	var errs []error
	for _, c := range candidates {
		if live[appName(c.owner)] {
			continue
		}
		// IF EXISTS: another process's sweep may have dropped it first.
		if _, err := db.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{c.name}.Sanitize()+" CASCADE"); err != nil {
			errs = append(errs, fmt.Errorf("drop %s: %w", c.name, err))
			continue
		}
		dropped = append(dropped, c.name)
	}
	if err := errors.Join(errs...); err != nil {
		return dropped, fmt.Errorf("sweep: %w", err)
	}
	return dropped, nil
}
