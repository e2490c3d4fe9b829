package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/matryer/is"
)

// TestWorkerRole: the owner applies the schema (migrate apply) and grants
// a worker role what schema.Grants prints (migrate grants); the role then
// runs the operator's commands (publish, stats, groups, group, peek,
// pause, resume, purge, dead list), none of which applies or changes the
// schema, and cannot run the migration itself.
func TestWorkerRole(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, true)
	ctx := context.Background()
	role := "w_" + h.schema
	_, err := h.pool.Exec(ctx, `CREATE ROLE `+pgx.Identifier{role}.Sanitize()+` LOGIN`)
	is.NoErr(err)
	t.Cleanup(func() {
		for _, q := range []string{`DROP OWNED BY `, `DROP ROLE `} {
			if _, err := h.pool.Exec(context.Background(), q+pgx.Identifier{role}.Sanitize()); err != nil {
				t.Errorf("%s%s: %v", q, role, err)
			}
		}
	})
	_, err = h.pool.Exec(ctx, h.ok("", "migrate", "grants", role).stdout)
	is.NoErr(err)

	cfg, err := pgconn.ParseConfig(testDSN())
	is.NoErr(err)
	dsn := (&url.URL{Scheme: "postgres", User: url.User(role), Host: fmt.Sprintf("%s:%d", cfg.Host, cfg.Port), Path: "/" + cfg.Database}).String()
	as := func(stdin string, args ...string) result { // a later --dsn wins over the harness's
		return h.run(stdin, append([]string{"--dsn=" + dsn}, args...)...)
	}
	okAs := func(stdin string, args ...string) string {
		t.Helper()
		r := as(stdin, args...)
		if r.code != 0 {
			t.Fatalf("%v as %s: exit %d\n%s", args, role, r.code, r.stderr)
		}
		return r.stdout
	}
	var who string
	is.NoErr(h.pool.QueryRow(ctx, `SELECT count(*)::text FROM pg_roles WHERE rolname = $1 AND NOT rolsuper`, role).Scan(&who))
	is.Equal(who, "1") // an ordinary role

	okAs(`{"group":"g","event":"1"}`+"\n"+`{"group":"g","event":"2"}`+"\n", "publish")
	is.True(strings.Contains(okAs("", "stats"), "all"))
	is.True(strings.Contains(okAs("", "groups", "--order", "oldest_head"), "g"))
	is.True(strings.Contains(okAs("", "group", "g"), "g"))
	is.True(strings.Contains(okAs("", "peek", "g"), "1"))
	okAs("", "pause", "g")
	okAs("", "resume", "g")
	okAs("", "dead", "list")
	okAs("", "purge", "g", "--yes")
	is.Equal(h.counts().messages, int64(0)) // the purge went through

	// The migration is the owner's: the role may not create the schema.
	r := h.run("", "--dsn="+dsn, "--schema="+h.schema+"_new", "migrate", "apply")
	is.Equal(r.code, exitFailed)
	is.True(strings.Contains(r.stderr, "permission denied"))
}
