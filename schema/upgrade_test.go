package schema_test

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// shipped is the complete script of shipped version n, as SQL() printed it
// when that version was current.
func shipped(t *testing.T, n int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("../testdata/schema/v%d.sql", n))
	if err != nil {
		t.Fatalf("the script of version %d: %v", n, err)
	}
	return string(b)
}

// load runs a complete script in db's schema, as psql would with
// search_path set to it.
func load(t *testing.T, db *pgtest.DB, script string) {
	t.Helper()
	if _, err := db.Pool.Exec(ctx(t), script); err != nil {
		t.Fatalf("load script: %v", err)
	}
}

// TestScriptIsShipped pins the script of the current version: the
// functions files have no version of their own, so a change to one (or to
// a numbered file) that comes without a new version would reach no
// database already at this one.
func TestScriptIsShipped(t *testing.T) {
	n := schema.Version()
	want, err := os.ReadFile(fmt.Sprintf("../testdata/schema/v%d.sql", n))
	if err != nil {
		t.Fatalf("testdata/schema/v%d.sql: %v\nA new version needs its script: make schema > testdata/schema/v%d.sql", n, err, n)
	}
	if got := schema.SQL(); got != string(want) {
		t.Fatalf("schema.SQL() differs from testdata/schema/v%d.sql, the script of shipped version %d (first difference: %s).\n"+
			"A shipped version's script never changes: databases already at version %d would never run the change. "+
			"Keep v%d.sql as it is; add a new numbered step (schema/sql/%03d_<what>.sql; a comment-only one will do when only "+
			"a functions file changed), then record the new version's script: make schema > testdata/schema/v%d.sql",
			n, n, firstDiff(string(want), got), n, n, n+1, n+1)
	}
}

// TestUpgradeEndsAsFresh loads the script of every earlier shipped version
// into a fresh schema, upgrades it (with Apply, and with the current script
// as a team with its own migration tool would), and compares the catalog
// with that of a fresh install: an upgrade step that forgot an index, or a
// shipped step edited afterwards, shows up as a difference.
func TestUpgradeEndsAsFresh(t *testing.T) {
	t.Parallel()
	fresh := pgtest.New(t, 2)
	is.New(t).NoErr(schema.Apply(ctx(t), fresh.Pool, fresh.Schema))
	want := readCatalog(t, fresh)
	for n := 1; n < schema.Version(); n++ {
		for _, via := range []string{"Apply", "SQL"} {
			t.Run("v"+strconv.Itoa(n)+"/"+via, func(t *testing.T) {
				t.Parallel()
				is := is.New(t)
				db := pgtest.New(t, 2)
				load(t, db, shipped(t, n))
				v, err := schema.CurrentVersion(ctx(t), db.Pool, db.Schema)
				is.NoErr(err)
				is.Equal(v, n) // the fixture is the script of version n
				if via == "Apply" {
					is.NoErr(schema.Apply(ctx(t), db.Pool, db.Schema))
				} else {
					load(t, db, schema.SQL())
				}
				if d := diffCatalogs(want, readCatalog(t, db)); d != "" {
					t.Errorf("upgraded from version %d with %s, the catalog differs from a fresh install's (- fresh, + upgraded):\n%s", n, via, d)
				}
			})
		}
	}
}

// catalogQuery lists everything Apply creates in schema $1 as (key, value)
// rows, each object once: functions, relations and their storage options,
// columns, constraints, indexes, triggers, sequences, and the versions
// recorded. The schema's name is replaced by <schema> afterwards.
const catalogQuery = `
SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
       concat_ws(E'\n',
         'returns ' || pg_get_function_result(p.oid),
         'language ' || l.lanname || ', volatility ' || p.provolatile::text || ', kind ' || p.prokind::text,
         'config ' || COALESCE(p.proconfig::text, '(none)'),
         pg_get_functiondef(p.oid))
  FROM pg_proc AS p JOIN pg_language AS l ON l.oid = p.prolang
 WHERE p.pronamespace = $1::regnamespace
UNION ALL
SELECT 'relation ' || c.relname,
       'kind ' || c.relkind::text || ', persistence ' || c.relpersistence::text || ', options ' || COALESCE(c.reloptions::text, '(none)')
  FROM pg_class AS c
 WHERE c.relnamespace = $1::regnamespace
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname,
       concat_ws(', ',
         'position ' || row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum),
         format_type(a.atttypid, a.atttypmod),
         CASE WHEN a.attnotnull THEN 'not null' END,
         'default ' || pg_get_expr(d.adbin, d.adrelid),
         NULLIF('identity ' || a.attidentity::text, 'identity '),
         NULLIF('generated ' || a.attgenerated::text, 'generated '),
         'collation ' || a.attcollation::regcollation)
  FROM pg_class AS c
  JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef AS d ON d.adrelid = c.oid AND d.adnum = a.attnum
 WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
UNION ALL
SELECT 'constraint ' || c.relname || '.' || k.conname,
       k.contype::text || ': ' || pg_get_constraintdef(k.oid)
  FROM pg_constraint AS k JOIN pg_class AS c ON c.oid = k.conrelid
 WHERE c.relnamespace = $1::regnamespace
UNION ALL
SELECT 'index ' || c.relname, pg_get_indexdef(c.oid)
  FROM pg_class AS c
 WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('i', 'I')
UNION ALL
SELECT 'trigger ' || c.relname || '.' || g.tgname, pg_get_triggerdef(g.oid) || ' (enabled ' || g.tgenabled::text || ')'
  FROM pg_trigger AS g JOIN pg_class AS c ON c.oid = g.tgrelid
 WHERE c.relnamespace = $1::regnamespace AND NOT g.tgisinternal
UNION ALL
SELECT 'sequence ' || c.relname,
       concat_ws(', ', s.seqtypid::regtype::text, 'start ' || s.seqstart, 'increment ' || s.seqincrement,
         'min ' || s.seqmin, 'max ' || s.seqmax, 'cache ' || s.seqcache, 'cycle ' || s.seqcycle,
         'owned by ' || (SELECT o.relname || '.' || a.attname
                           FROM pg_depend AS dep
                           JOIN pg_class AS o ON o.oid = dep.refobjid
                           JOIN pg_attribute AS a ON a.attrelid = o.oid AND a.attnum = dep.refobjsubid
                          WHERE dep.classid = 'pg_class'::regclass AND dep.objid = c.oid AND dep.deptype IN ('a', 'i')))
  FROM pg_sequence AS s JOIN pg_class AS c ON c.oid = s.seqrelid
 WHERE c.relnamespace = $1::regnamespace
UNION ALL
SELECT 'versions', COALESCE(string_agg(v.version::text, ',' ORDER BY v.version), '(none)')
  FROM transport_schema_version AS v`

// readCatalog reads db's schema as catalogQuery lists it, keyed by object.
func readCatalog(t *testing.T, db *pgtest.DB) map[string]string {
	t.Helper()
	rows, err := db.Pool.Query(ctx(t), catalogQuery, db.Schema)
	if err != nil {
		t.Fatalf("read catalog: %v", err)
	}
	type entry struct{ Key, Value string }
	entries, err := pgx.CollectRows(rows, pgx.RowToStructByPos[entry])
	if err != nil {
		t.Fatalf("read catalog: %v", err)
	}
	cat := make(map[string]string, len(entries))
	for _, e := range entries {
		key := strings.ReplaceAll(e.Key, db.Schema, "<schema>")
		if _, dup := cat[key]; dup {
			t.Fatalf("read catalog: %s listed twice", key)
		}
		cat[key] = strings.ReplaceAll(e.Value, db.Schema, "<schema>")
	}
	if len(cat) < 20 {
		t.Fatalf("read catalog: only %d objects in schema %s", len(cat), db.Schema)
	}
	return cat
}

// diffCatalogs describes how got differs from want, object by object; empty
// if they are the same.
func diffCatalogs(want, got map[string]string) string {
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		w, inWant := want[k]
		g, inGot := got[k]
		switch {
		case !inGot:
			fmt.Fprintf(&b, "- %s: %s\n", k, w)
		case !inWant:
			fmt.Fprintf(&b, "+ %s: %s\n", k, g)
		case w != g:
			fmt.Fprintf(&b, "  %s: %s\n", k, firstDiff(w, g))
		}
	}
	return b.String()
}

// firstDiff shows the first line where a and b differ, with its number.
func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < max(len(al), len(bl)); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return fmt.Sprintf("line %d:\n    - %s\n    + %s", i+1, x, y)
		}
	}
	return "(none)"
}

// TestStepsAndFunctionsMakeTheScript: what Migrations and Functions hand a
// team's own migration tool is what SQL and Apply run, nothing left out.
func TestStepsAndFunctionsMakeTheScript(t *testing.T) {
	is := is.New(t)
	script := schema.SQL()
	for _, m := range schema.Migrations() {
		is.True(strings.Contains(script, m.SQL)) // each step is in the script
	}
	is.True(strings.Contains(script, schema.Functions()))                // and the functions
	is.True(strings.Contains(schema.Functions(), "FUNCTION harel_ack(")) // which hold the protocol's
	for _, m := range schema.Migrations() {
		is.True(!strings.Contains(m.SQL, "CREATE OR REPLACE FUNCTION")) // and only they
	}
}
