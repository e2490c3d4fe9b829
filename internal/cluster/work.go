package cluster

import (
	"context"
	"errors"

	"github.com/pgtransport/pgtransport"
)

// Shares splits conc worker slots over the partitions: each its equal
// share, the first ones one more while any is left, and at least one each
// (a partition with no slot would never be served), so the total is the
// larger of conc and N. Per-message cost holds steady when each partition
// is served by its own share of the slots (bench suite proxy).
func (cl *Cluster) Shares(conc int) []int {
	n := len(cl.parts)
	shares := make([]int, n)
	for i := range shares {
		shares[i] = max(conc/n+btoi(i < conc%n), 1)
	}
	return shares
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// RunEach runs run(ctx, i, cfg with Concurrency its Shares) for every
// partition at once (a worker runtime each), until all have returned. The
// first error cancels the others' ctx and is returned (with any others
// they then return).
func (cl *Cluster) RunEach(ctx context.Context, cfg pgtransport.WorkerConfig, run func(ctx context.Context, i int, cfg pgtransport.WorkerConfig) error) error {
	if len(cl.parts) == 1 {
		return run(ctx, 0, cfg)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	shares := cl.Shares(cfg.Concurrency)
	errs := make([]error, len(cl.parts))
	each(cl.all(), func(i int) {
		cfg := cfg
		cfg.Concurrency = shares[i]
		if errs[i] = run(ctx, i, cfg); errs[i] != nil {
			errs[i] = partitionErr(len(cl.parts), i, errs[i])
			cancel()
		}
	})
	return errors.Join(errs...)
}
