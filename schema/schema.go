// Package schema creates and upgrades the tables and server-side functions
// the transports use.
//
// The SQL lives in two kinds of embedded files. The numbered files
// (sql/NNN_*.sql) are forward-only, idempotent upgrade steps and hold only
// what must run once in a database's life: tables, columns, indexes,
// storage settings; sql/tables.sql shows what they add up to, every table
// as it is now (documentation, not applied; TestTablesMatchTheSteps checks
// it against the catalog the steps build). The files of sql/functions/,
// one per section (NN_<section>.sql: 10_guard.sql, 20_publish.sql,
// 30_claim.sql, ...), hold the live definition of every function and
// trigger, each once, with its settings inline: a reader finds the code
// that runs in one place instead of piecing a function together from the
// steps that redefined it. The functions are named harel_*, the protocol's
// name from the design; clients in other languages call them.
//
// Apply runs the steps a database lacks and then every functions file, in
// name order, in one transaction under a transaction-scoped advisory lock,
// whenever the recorded version is below Version, so any number of
// workers may apply at once; it records each version in
// transport_schema_version. A change to a functions file therefore ships
// with a new numbered step (a comment-only one will do). The script of
// every shipped version is kept in testdata/schema/vN.sql: the tests check
// that the current one is SQL() byte for byte and that a database upgraded
// from each earlier one ends with exactly the catalog of a fresh install.
// SQL returns the whole script for teams that run their own migration
// tool.
package schema

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtransport/pgtransport"
)

// tables.sql is left out: it is documentation, read by a test only.
//
//go:embed sql/[0-9]*.sql sql/functions/*.sql sql/proxy.sql
var files embed.FS

// functionFile is one file of sql/functions/.
type functionFile struct {
	name string // e.g. "30_claim.sql"
	sql  string
}

// functionFiles are the files of sql/functions/ in name order, the order
// Apply runs them in, after the numbered steps; functions is their text,
// one after the other, each followed by a blank line.
var functionFiles, functions = loadFunctions()

func loadFunctions() ([]functionFile, string) {
	names, err := fs.Glob(files, "sql/functions/*.sql")
	if err != nil {
		panic(err)
	}
	var ffs []functionFile
	var b strings.Builder
	for _, name := range names {
		base := path.Base(name)
		num, _, ok := strings.Cut(base, "_")
		if _, err := strconv.Atoi(num); !ok || err != nil || len(num) != 2 {
			panic("schema: a functions file's name must start with two digits and an underscore: " + base)
		}
		if len(ffs) > 0 && strings.HasPrefix(ffs[len(ffs)-1].name, num+"_") {
			panic("schema: two functions files share the number " + num)
		}
		ff := functionFile{name: base, sql: mustRead(name) + "\n"}
		ffs = append(ffs, ff)
		b.WriteString(ff.sql)
	}
	if len(ffs) == 0 {
		panic("schema: no functions files")
	}
	return ffs, b.String()
}

// proxy is sql/proxy.sql, a proxy database's functions (ApplyProxy).
var proxy = mustRead("sql/proxy.sql")

func mustRead(name string) string {
	body, err := files.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return string(body)
}

// Migration is one numbered schema file: an upgrade step.
type Migration struct {
	Version int
	Name    string // file name, e.g. "001_init.sql"
	SQL     string
}

var migrations = load()

func load() []Migration {
	names, err := fs.Glob(files, "sql/[0-9]*.sql")
	if err != nil {
		panic(err)
	}
	var ms []Migration
	for _, name := range names {
		base := path.Base(name)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			panic("schema: file name must start with a number and an underscore: " + base)
		}
		ms = append(ms, Migration{Version: v, Name: base, SQL: mustRead(name)})
	}
	slices.SortFunc(ms, func(a, b Migration) int { return a.Version - b.Version })
	for i, m := range ms {
		if m.Version != i+1 {
			panic(fmt.Sprintf("schema: versions must run 1, 2, 3, ...: %s", m.Name))
		}
	}
	return ms
}

// Migrations returns the numbered schema files in version order. Since
// version 8 they hold no function: a migration tool that runs them one by
// one must run Functions after the last step it ran, in the same
// transaction, as Apply does (or load SQL, which has both).
func Migrations() []Migration { return slices.Clone(migrations) }

// Functions returns the files of sql/functions/, one after the other in
// name order: the definition of every function and trigger, idempotent, to
// run after the numbered steps whenever any ran.
func Functions() string { return functions }

// Version is the schema version this library applies.
func Version() int { return migrations[len(migrations)-1].Version }

// lockClass is the first key of the advisory lock Apply takes; the second is
// a hash of the schema name, so applies to different schemas do not wait on
// each other.
// The prelude spells it out: 1885828208 == 0x70677470, "pgtp".
const lockClass = 0x70677470

// prelude takes the apply lock and points search_path at the target schema
// (followed by pg_temp, so no temporary object can shadow ours), which
// SET search_path FROM CURRENT then pins in every function. Empty $1 means
// the current schema.
const prelude = `DO $pgtransport$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pgtransport: no current schema: search_path names no existing schema';
    END IF;
    PERFORM pg_advisory_xact_lock(1885828208, hashtext(current_schema()));
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pgtransport$;
`

const versionTable = `CREATE TABLE IF NOT EXISTS transport_schema_version (
    version    INT PRIMARY KEY,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
`

// ValidateName reports whether name can be used as Config.Schema: empty (the
// connection's current schema), or 1 to 63 bytes of valid UTF-8 without NUL,
// not starting with "pg_" (reserved by PostgreSQL).
func ValidateName(name string) error {
	switch {
	case name == "":
		return nil
	case len(name) > 63:
		return fmt.Errorf("%w: %d bytes, the limit is 63", pgtransport.ErrInvalidSchema, len(name))
	case !utf8.ValidString(name), strings.ContainsRune(name, 0):
		return fmt.Errorf("%w: not valid UTF-8 text", pgtransport.ErrInvalidSchema)
	case strings.HasPrefix(strings.ToLower(name), "pg_"):
		return fmt.Errorf("%w: %q: names starting with pg_ are reserved", pgtransport.ErrInvalidSchema, name)
	}
	return nil
}

// Beginner starts a transaction: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Apply brings the schema named name (created if absent; empty means the
// connection's current schema) up to Version: the numbered steps it lacks,
// then every function and trigger. It runs in one transaction under an
// advisory lock: concurrent calls all succeed, and a call on an up-to-date
// schema changes nothing. A proxy's schema (ApplyProxy) is refused with
// ErrInvalidSchema.
func Apply(ctx context.Context, db Beginner, name string) error {
	return inSchema(ctx, db, name, func(tx pgx.Tx) error {
		var isProxy bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass('transport_proxy') IS NOT NULL`).Scan(&isProxy); err != nil {
			return fmt.Errorf("schema: read schema: %w", err)
		}
		if isProxy {
			return fmt.Errorf("%w: %q is a proxy's schema (ApplyProxy); the queue's goes on each partition", pgtransport.ErrInvalidSchema, name)
		}
		// Read the version before creating anything, so that a role that may
		// not change the schema (a worker's) applies an up-to-date one.
		var versioned bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass('transport_schema_version') IS NOT NULL`).Scan(&versioned); err != nil {
			return fmt.Errorf("schema: read schema: %w", err)
		}
		if !versioned {
			if _, err := tx.Exec(ctx, versionTable); err != nil {
				return fmt.Errorf("schema: version table: %w", err)
			}
		}
		var current int
		if err := tx.QueryRow(ctx, `SELECT COALESCE(max(version), 0) FROM transport_schema_version`).Scan(&current); err != nil {
			return fmt.Errorf("schema: read version: %w", err)
		}
		// Up to date (or applied by a newer library): run nothing, not even
		// the functions, so an idle Apply rewrites no catalog row.
		if current >= Version() {
			return nil
		}
		for _, m := range migrations[current:] {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("schema: %s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO transport_schema_version (version) VALUES ($1)`, m.Version); err != nil {
				return fmt.Errorf("schema: record %s: %w", m.Name, err)
			}
		}
		for _, f := range functionFiles {
			if _, err := tx.Exec(ctx, f.sql); err != nil {
				return fmt.Errorf("schema: functions/%s: %w", f.name, err)
			}
		}
		return nil
	})
}

// inSchema runs apply in one transaction on db, with search_path on the
// schema named name (created if absent; empty: the current schema) and the
// apply lock held, and commits if it returns nil.
func inSchema(ctx context.Context, db Beginner, name string, apply func(pgx.Tx) error) (err error) {
	if err := ValidateName(name); err != nil {
		return err
	}
	if v := reflect.ValueOf(db); db == nil || v.Kind() == reflect.Pointer && v.IsNil() {
		return fmt.Errorf("schema: %w: nil database handle", pgtransport.ErrInvalidConfig)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("schema: begin: %w", err)
	}
	defer func() {
		if err != nil {
			// Roll back even when ctx is done, but never hang on it.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = tx.Rollback(rctx)
		}
	}()
	if name != "" {
		ident := pgx.Identifier{name}.Sanitize()
		// Serialize CREATE SCHEMA too: IF NOT EXISTS still races otherwise.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, lockClass, name); err != nil {
			return fmt.Errorf("schema: lock: %w", err)
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regnamespace($1) IS NOT NULL`, ident).Scan(&exists); err != nil {
			return fmt.Errorf("schema: read schema: %w", err)
		}
		if !exists { // created only when absent: a role that may not create one uses it as it is
			if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+ident); err != nil {
				return fmt.Errorf("schema: create schema: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, ident); err != nil {
			return fmt.Errorf("schema: search_path: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, prelude); err != nil {
		return fmt.Errorf("schema: lock: %w", err)
	}
	if err := apply(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("schema: commit: %w", err)
	}
	return nil
}

// Partition numbers the queue in the schema named name (empty: the current
// one), already brought to Version by Apply, as partition index (0 to
// 1,023) of a cluster behind a proxy (ApplyProxy), and makes its message
// seqs disjoint from every other partition's (seq & 1023 == index). Run it
// on each partition, by the schema's owner, before the proxy routes to it;
// again with the same index it changes nothing. Another index than the one
// recorded, or one out of range, is ErrInvalidConfig: the messages there
// would be looked for in another partition.
func Partition(ctx context.Context, db Beginner, name string, index int) error {
	if index < 0 || index > 1023 {
		return fmt.Errorf("schema: %w: partition index %d is not 0 to 1023", pgtransport.ErrInvalidConfig, index)
	}
	return inSchema(ctx, db, name, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT harel_partition($1)`, index)
		return refused(err, "number the partition")
	})
}

// refused is err of the call that would do what: a refusal of the
// partitions' functions (22023: a cluster or number that would misroute)
// as ErrInvalidConfig with the server's reason, anything else wrapped.
func refused(err error, what string) error {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "22023" {
		return fmt.Errorf("schema: %w: %s", pgtransport.ErrInvalidConfig, pgErr.Message)
	}
	if err != nil {
		return fmt.Errorf("schema: %s: %w", what, err)
	}
	return nil
}

// ApplyProxy installs, in the schema named name of a proxy database (empty:
// the current one), the protocol's functions as PL/Proxy functions over
// cluster pgtransport: sql/proxy.sql, which says what each does and what a
// proxy cannot. The database needs the plproxy extension and the cluster (a
// foreign server pgtransport of the plproxy wrapper whose options p0 ...
// pN-1 name the partitions, N a power of two, and a user mapping); each
// partition needs the queue in a schema of the same name at Version
// (Apply), numbered by its place (Partition). ApplyProxy checks all of that
// through the cluster and refuses, with ErrInvalidConfig, what would route
// wrongly; a queue's own schema is ErrInvalidSchema. It runs in one
// transaction under the apply lock; on an up-to-date proxy it changes
// nothing but still checks the partitions.
func ApplyProxy(ctx context.Context, db Beginner, name string) error {
	return inSchema(ctx, db, name, func(tx pgx.Tx) error {
		var isQueue, hasPLProxy bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass('transport_schema_version') IS NOT NULL,
		                                   EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'plproxy')`).Scan(&isQueue, &hasPLProxy); err != nil {
			return fmt.Errorf("schema: read schema: %w", err)
		}
		switch {
		case isQueue:
			return fmt.Errorf("%w: %q holds a queue (Apply); a proxy's schema holds none", pgtransport.ErrInvalidSchema, name)
		case !hasPLProxy:
			return fmt.Errorf("schema: %w: the proxy database has no plproxy extension (CREATE EXTENSION plproxy; Debian: apt-get install postgresql-<version>-plproxy)", pgtransport.ErrInvalidConfig)
		}
		if _, err := tx.Exec(ctx, proxyTable); err != nil {
			return fmt.Errorf("schema: proxy table: %w", err)
		}
		var current int
		if err := tx.QueryRow(ctx, `SELECT COALESCE(max(version), 0) FROM transport_proxy`).Scan(&current); err != nil {
			return fmt.Errorf("schema: read version: %w", err)
		}
		if current < Version() {
			if _, err := tx.Exec(ctx, proxy); err != nil {
				return fmt.Errorf("schema: proxy.sql: %w", err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO transport_proxy (version) VALUES ($1)`, Version()); err != nil {
				return fmt.Errorf("schema: record the proxy's version: %w", err)
			}
		}
		_, err := tx.Exec(ctx, `SELECT harel_px_check($1)`, Version())
		return refused(err, "check the partitions")
	})
}

// ErrNotGrown is Grown's refusal while a growing cluster's partitions
// still hold something of groups whose home is another partition: rows
// that drain as their messages are handled, kept states and dedup keys
// that expire, dead letters that wait for a redrive (which drains them in
// place) or a purge. The error says how many of each, per partition.
var ErrNotGrown = errors.New("schema: moving groups remain in their old partitions")

// Grow grows the queue behind the proxy database db (the schema named
// name; empty: the current one) from the N partitions its proxy was
// checked with to 2N (docs/protocol.md, "Growing the cluster"). partitions
// are the N new partitions' connection strings, as cluster pgtransport
// lists the others (PL/Proxy's libpq syntax); each must hold the queue at
// Version (Apply), numbered N + k (Partition), and be empty. In one
// transaction under the apply lock it adds them to the cluster (ALTER
// SERVER: needs the server's owner) and calls harel_px_grow, which checks
// every partition, arms each (its fence: harel_grow, needs the schema's
// owner there, committed on each partition on its own) and records 2N and
// the count it grew from. With no partitions it only calls harel_px_grow:
// for a cluster whose ALTER SERVER an operator committed by hand (every
// call through the proxy is refused until then). It returns 2N.
// What would route wrongly is ErrInvalidConfig, with the proxy's reason.
// Clients opened before keep working but are refused (ErrGroupMoved) a
// publish of a moving group that has left its old partition: reopen them.
func Grow(ctx context.Context, db Beginner, name string, partitions []string) (int, error) {
	var n int
	err := inSchema(ctx, db, name, func(tx pgx.Tx) error {
		if len(partitions) > 0 {
			var n *int
			if err := tx.QueryRow(ctx, `SELECT (SELECT parts FROM transport_proxy_parts)`).Scan(&n); err != nil {
				return fmt.Errorf("schema: grow: %w", err)
			}
			if n != nil && len(partitions) != *n {
				return fmt.Errorf("schema: %w: the cluster has %d partitions: growing it needs %d new partitions' connection strings (p%d to p%d), not %d",
					pgtransport.ErrInvalidConfig, *n, *n, *n, 2**n-1, len(partitions))
			}
			var alter string
			if err := tx.QueryRow(ctx, `
				SELECT COALESCE('ALTER SERVER pgtransport OPTIONS ('
				       || string_agg(format('ADD p%s %L', p.parts + t.i - 1, t.c), ', ' ORDER BY t.i) || ')', '')
				  FROM transport_proxy_parts AS p, unnest($1::TEXT[]) WITH ORDINALITY AS t(c, i)`, partitions).Scan(&alter); err != nil {
				return fmt.Errorf("schema: grow: %w", err)
			}
			if alter == "" {
				return fmt.Errorf("schema: %w: the proxy has not been checked against cluster pgtransport (ApplyProxy)", pgtransport.ErrInvalidConfig)
			}
			if _, err := tx.Exec(ctx, alter); err != nil {
				return fmt.Errorf("schema: grow: add the partitions: %w", err)
			}
		}
		return refused(tx.QueryRow(ctx, `SELECT harel_px_grow($1)`, Version()).Scan(&n), "grow the cluster")
	})
	return n, err
}

// Grown ends the growth of the queue behind the proxy database db (Grow):
// ErrNotGrown, changing nothing, while any partition holds something of a
// group whose home is another; else every partition and the proxy forget
// the count it grew from, the proxy routes each group straight to its
// home, and Clusters opened from then on do too. It returns the partition
// count; with no growth under way it changes nothing.
func Grown(ctx context.Context, db Beginner, name string) (int, error) {
	var n int
	err := inSchema(ctx, db, name, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT harel_px_grown()`).Scan(&n)
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "55000" {
			return fmt.Errorf("%w: %s", ErrNotGrown, pgErr.Message)
		}
		return refused(err, "end the growth")
	})
	return n, err
}

// ProxyGrants returns the statements that let role work a queue through
// the proxy in schema (empty: public) of a proxy database: call its
// functions, make the design's two-INSERT publish (into the views
// transport_messages and transport_groups; the rows wait in
// transport_px_messages and transport_px_groups, which the publisher's
// commit reads and empties, until they go to the partitions), read the
// partition count the proxy was checked with, and use cluster pgtransport.
// PL/Proxy connects to the partitions as the calling role
// unless the cluster's connection strings or user mapping name another, so
// that role needs Grants on every partition too. Identifiers are quoted;
// errors as Grants'.
func ProxyGrants(schema, role string) (string, error) {
	if _, err := Grants(schema, role); err != nil {
		return "", err
	}
	s := pgx.Identifier{cmp.Or(schema, "public")}.Sanitize()
	r := pgx.Identifier{role}.Sanitize()
	return strings.Join([]string{
		"GRANT USAGE ON SCHEMA " + s + " TO " + r,
		"GRANT SELECT, INSERT ON " + s + ".transport_messages, " + s + ".transport_groups TO " + r,
		"GRANT SELECT, INSERT, DELETE ON " + s + ".transport_px_messages, " + s + ".transport_px_groups TO " + r,
		"GRANT SELECT ON " + s + ".transport_proxy_parts TO " + r,
		"GRANT USAGE ON SEQUENCE " + s + ".transport_messages_seq_seq TO " + r,
		"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA " + s + " TO " + r,
		"GRANT USAGE ON FOREIGN SERVER pgtransport TO " + r,
	}, ";\n") + ";\n", nil
}

// proxyTable marks a proxy's schema and records the versions of proxy.sql
// applied there; Apply refuses a schema that has it.
const proxyTable = `CREATE TABLE IF NOT EXISTS transport_proxy (
    version    INT PRIMARY KEY,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
`

// ProxySQL returns the proxy's complete script, loadable with psql into a
// proxy database that has the plproxy extension and the cluster: what
// ApplyProxy runs, in the current schema, in one transaction, ending with
// the partitions' check.
func ProxySQL() string {
	var b strings.Builder
	scriptStart(&b, "proxy", "make proxy-schema")
	b.WriteString(proxyTable)
	fmt.Fprintf(&b, "\n-- proxy.sql\n%s", proxy)
	fmt.Fprintf(&b, "\nINSERT INTO transport_proxy (version) VALUES (%d) ON CONFLICT (version) DO NOTHING;\n", Version())
	fmt.Fprintf(&b, "SELECT harel_px_check(%d);\nCOMMIT;\n", Version())
	return b.String()
}

// CurrentVersion reports the version recorded in the named schema, 0 if none.
func CurrentVersion(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, name string) (int, error) {
	return recorded(ctx, db, name, "transport_schema_version")
}

// ProxyVersion reports the version of proxy.sql recorded in the named
// schema of a proxy database (ApplyProxy), 0 if none.
func ProxyVersion(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, name string) (int, error) {
	return recorded(ctx, db, name, "transport_proxy")
}

func recorded(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, name, table string) (int, error) {
	t := pgx.Identifier{table}
	if name != "" {
		t = pgx.Identifier{name, table}
	}
	var v int
	err := db.QueryRow(ctx, `SELECT COALESCE(max(version), 0) FROM `+t.Sanitize()).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("schema: read version: %w", err)
	}
	return v, nil
}

// scriptStart writes a script's head: what it is and where it creates
// things, BEGIN, and the prelude.
func scriptStart(b *strings.Builder, what, target string) {
	fmt.Fprintf(b, "-- pgtransport %s, version %d. Generated by `%s`; do not edit.\n", what, Version(), target)
	b.WriteString("-- Creates every object in the current schema (the first existing schema on search_path).\n")
	b.WriteString("BEGIN;\n")
	b.WriteString(prelude)
}

// SQL returns the complete script, loadable with psql into an empty database
// or over any earlier version: it creates everything in the current schema
// (the first existing one on search_path), in one transaction: every
// numbered step (each is idempotent), then the functions files in name
// order (Functions), and records the versions.
func SQL() string {
	var b strings.Builder
	scriptStart(&b, "schema", "make schema")
	b.WriteString(versionTable)
	for _, m := range migrations {
		fmt.Fprintf(&b, "\n-- %s\n%s", m.Name, m.SQL)
	}
	fmt.Fprintf(&b, "\n-- functions/*.sql, in name order\n%s", functions)
	b.WriteString("\nINSERT INTO transport_schema_version (version) VALUES ")
	for i, m := range migrations {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(%d)", m.Version)
	}
	b.WriteString("\n    ON CONFLICT (version) DO NOTHING;\nCOMMIT;\n")
	return b.String()
}

// Grants returns the statements that let role work a queue in schema (empty:
// public) and nothing more: publish, claim, ack, nack, extend, the batch
// calls, the wake-ups, fail, keyed publish, the dead letters (list,
// redrive, purge) and the per-group state (AckStateTx, State; a drained
// group's kept state). It may read the queue's retry policy (transport_policy)
// but not change it: a transport whose Config sets a policy field needs a
// role that may (the owner). The role needs no other privilege; it cannot
// change the tables or replace the functions (only their owner, the role
// that applies the schema, can), and it cannot VACUUM them
// (Config.Async.Vacuum needs the owner too). Identifiers are quoted. An empty
// role is ErrInvalidConfig; a schema name ValidateName refuses is
// ErrInvalidSchema.
func Grants(schema, role string) (string, error) {
	if err := ValidateName(schema); err != nil {
		return "", err
	}
	if role == "" || !utf8.ValidString(role) || strings.ContainsRune(role, 0) {
		return "", fmt.Errorf("%w: role name %q", pgtransport.ErrInvalidConfig, role)
	}
	s := pgx.Identifier{cmp.Or(schema, "public")}.Sanitize()
	r := pgx.Identifier{role}.Sanitize()
	return strings.Join([]string{
		"GRANT USAGE ON SCHEMA " + s + " TO " + r,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + s + ".transport_messages, " + s + ".transport_groups, " + s + ".transport_waiters, " +
			s + ".transport_dead_letters, " + s + ".transport_dedup, " + s + ".transport_kept_states, " + s + ".transport_ready, " + s + ".transport_tenants, " + s + ".transport_tenant_counts TO " + r,
		"GRANT SELECT ON " + s + ".transport_schema_version, " + s + ".transport_policy, " + s + ".transport_partition TO " + r,
		"GRANT USAGE ON ALL SEQUENCES IN SCHEMA " + s + " TO " + r,
		"GRANT SELECT, UPDATE ON SEQUENCE " + s + ".transport_groups_slot, " + s + ".transport_claim_cursor, " + s + ".transport_claim_wrap, " + s + ".transport_claim_rest, " +
			s + ".transport_ready_rseq, " + s + ".transport_ready_front, " + s + ".transport_ready_check_vt, " + s + ".transport_ready_check_xid, " + s + ".transport_ready_vnow, " +
			s + ".transport_claim_reap_cursor TO " + r,
		"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA " + s + " TO " + r,
	}, ";\n") + ";\n", nil
}
