package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
)

// SetPolicy makes p the queue's policy on every partition, the partitions
// at once: each partition's write is atomic, the whole is not (an error
// names the partitions that failed; set it again). A bad p is refused
// before anything is sent.
func (cl *Cluster) SetPolicy(ctx context.Context, p pgtransport.Policy) error {
	if c := cl.one(); c != nil {
		return c.SetPolicy(ctx, p)
	}
	if err := core.CheckPolicy(p); err != nil {
		return fmt.Errorf("set policy: %w", err)
	}
	errs := make([]error, len(cl.parts))
	each(cl.all(), func(i int) {
		if err := cl.parts[i].SetPolicy(ctx, p); err != nil {
			errs[i] = partitionErr(len(cl.parts), i, err)
		}
	})
	return errors.Join(errs...)
}

// Policy is the queue's policy as partition 0 stores it (SetPolicy
// writes every partition alike).
func (cl *Cluster) Policy(ctx context.Context) (pgtransport.Policy, error) {
	return cl.parts[0].Policy(ctx)
}

// SetTenantWeight sets tenant's weight on every partition, at once (not
// atomically across: an error names the partitions that failed).
func (cl *Cluster) SetTenantWeight(ctx context.Context, tenant string, weight int) error {
	if c := cl.one(); c != nil {
		return c.SetTenantWeight(ctx, tenant, weight)
	}
	if err := cmp.Or(core.CheckTenant(tenant, false), core.CheckWeight(weight)); err != nil {
		return fmt.Errorf("set tenant weight: %w", err)
	}
	errs := make([]error, len(cl.parts))
	each(cl.all(), func(i int) {
		if err := cl.parts[i].SetTenantWeight(ctx, tenant, weight); err != nil {
			errs[i] = partitionErr(len(cl.parts), i, err)
		}
	})
	return errors.Join(errs...)
}
