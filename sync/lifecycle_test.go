package sync_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/contract"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// TestClosedEveryMethod: every method returns ErrClosed after Close, whether the
// Transport owns its pool (FromDSN) or not (New).
func TestClosedEveryMethod(t *testing.T) {
	contract.RunClosed(t,
		func(t *testing.T, pool *pgxpool.Pool, cfg pgtransport.Config) contract.Transport {
			tr, err := pgsync.New(ctx(t), pool, cfg)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			return tr
		},
		func(t *testing.T, dsn string, cfg pgtransport.Config) contract.Transport {
			tr, err := pgsync.FromDSN(ctx(t), dsn, cfg)
			if err != nil {
				t.Fatalf("FromDSN: %v", err)
			}
			t.Cleanup(tr.Close)
			return tr
		})
}
