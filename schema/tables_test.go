package schema_test

import (
	"os"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	"github.com/pgtransport/pgtransport/schema"
)

// TestTablesMatchTheSteps loads sql/tables.sql, the current shape of every
// table written out in one place, into an empty schema and compares its
// catalog with that of a schema Apply brought to the current version: the
// columns (type, default, NOT NULL, order), constraints, indexes, storage
// options and sequences must be the same, so a numbered step that changes
// a table fails here until tables.sql shows the change. Functions and
// triggers are left out (they live in sql/functions/), and so are the
// versions recorded.
func TestTablesMatchTheSteps(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tables, err := os.ReadFile("sql/tables.sql")
	is.NoErr(err) // tables.sql
	migrated := pgtest.New(t, 2)
	is.NoErr(schema.Apply(ctx(t), migrated.Pool, migrated.Schema))
	written := pgtest.New(t, 2)
	load(t, written, string(tables))

	want, got := shapeOf(readCatalog(t, migrated)), shapeOf(readCatalog(t, written))
	if d := diffCatalogs(want, got); d != "" {
		t.Errorf("schema/sql/tables.sql does not show the tables the numbered steps build (- the steps, + tables.sql); "+
			"write the change of the step into tables.sql:\n%s", d)
	}
	is.True(len(want) > 50) // every column, index and sequence was read
}

// shapeOf is the part of a catalog tables.sql shows: all but functions,
// triggers and the versions recorded.
func shapeOf(cat map[string]string) map[string]string {
	for k := range cat {
		if k == "versions" || strings.HasPrefix(k, "function ") || strings.HasPrefix(k, "trigger ") {
			delete(cat, k)
		}
	}
	return cat
}
