package sync_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/internal/testkit/contract"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// TestContract runs the contract against the blocking transport, on one
// database and over four partitions.
func TestContract(t *testing.T) {
	contract.Run(t, contract.Opener{DB: openDB, Partitions: openPartitions})
}

// openDB opens the transport under test on one database.
func openDB(t *testing.T, db core.DBTX, cfg pgtransport.Config) (contract.Transport, error) {
	t.Helper()
	tr, err := pgsync.New(context.Background(), db, cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(tr.Close)
	return tr, nil
}

// openPartitions opens the transport under test over partitions.
func openPartitions(t *testing.T, pools []*pgxpool.Pool, cfg pgtransport.Config) (contract.Transport, error) {
	t.Helper()
	c, err := pgsync.NewCluster(context.Background(), pools, cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(c.Close)
	return c, nil
}

// TestOpenCluster opens the transport over partitions from its proxy's
// map.
func TestOpenCluster(t *testing.T) {
	contract.RunOpenCluster(t, func(ctx context.Context, proxyDSN string, cfg pgtransport.Config) (contract.Transport, error) {
		c, err := pgsync.OpenCluster(ctx, proxyDSN, cfg)
		if err != nil {
			return nil, err
		}
		return c, nil
	})
}
