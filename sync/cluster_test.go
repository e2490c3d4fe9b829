package sync_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/contract"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// TestClusterContract runs the cluster cases against a sync.Cluster over
// four partitions.
func TestClusterContract(t *testing.T) {
	contract.RunCluster(t, func(t *testing.T, pools []*pgxpool.Pool, cfg pgtransport.Config) (contract.Closer, error) {
		c, err := pgsync.NewCluster(context.Background(), pools, cfg)
		if err != nil {
			return nil, err
		}
		t.Cleanup(c.Close)
		return c, nil
	})
}

// TestOpenCluster opens a sync.Cluster from its proxy's map.
func TestOpenCluster(t *testing.T) {
	contract.RunOpenCluster(t, func(ctx context.Context, proxyDSN string, cfg pgtransport.Config) (contract.Closer, error) {
		c, err := pgsync.OpenCluster(ctx, proxyDSN, cfg)
		if err != nil {
			return nil, err
		}
		return c, nil
	})
}
