package async_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/workertest"
)

// TestWork runs the runtime's cases against the async Transport's Work.
func TestWork(t *testing.T) {
	workertest.Run(t, func(t *testing.T, pool *pgxpool.Pool, cfg pgtransport.Config) workertest.Worker {
		tr, err := async.New(context.Background(), pool, cfg)
		if err != nil {
			t.Fatalf("new: %v", err)
		}
		t.Cleanup(tr.Close)
		return tr
	}, "github.com/pgtransport/pgtransport/async")
}
