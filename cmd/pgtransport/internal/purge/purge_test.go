package purge_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/cmd/pgtransport/internal/purge"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// open is a blocking transport on a schema of its own on the test server
// ($TEST_DATABASE_URL, else the local one), dropped when the test ends.
func open(t *testing.T) *pgsync.Transport {
	t.Helper()
	dsn := os.Getenv("TEST_DATABASE_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/postgres"
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "pgtpurge_" + hex.EncodeToString(b[:])
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
		pool.Close()
	})
	tr, err := pgsync.New(context.Background(), pool, pgtransport.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return tr
}

// TestPausedBetweenBatches: no claim takes the group between two batches
// of a purge, the group is resumed at the end (its row gone once empty),
// and a group that was paused before stays paused.
func TestPausedBetweenBatches(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	tr := open(t)
	for range 25 {
		_, err := tr.Publish(ctx, "g", "e", 0)
		is.NoErr(err)
	}
	var total int64
	err := purge.Paused(ctx, tr, "g", func() error {
		for {
			n, drained, err := purge.Batch(ctx, tr, "g", 10)
			if err != nil {
				return err
			}
			total += n
			l, err := tr.Claim(ctx, "w", time.Minute, 0)
			is.NoErr(err)
			is.Equal(l, nil) // between batches: nobody takes the group
			if drained {
				return nil
			}
		}
	})
	is.NoErr(err)
	is.Equal(total, int64(25))
	_, err = tr.Group(ctx, "g")
	is.True(errors.Is(err, pgtransport.ErrUnknownGroup)) // resumed, and the empty row went

	_, err = tr.Publish(ctx, "p", "e", 0)
	is.NoErr(err)
	is.NoErr(tr.PauseGroup(ctx, "p"))
	is.NoErr(purge.Paused(ctx, tr, "p", func() error { return nil }))
	g, err := tr.Group(ctx, "p")
	is.NoErr(err)
	is.Equal(g.State, pgtransport.GroupPaused) // paused before: stays paused
}
