package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
)

// rotation is the order a claim tries the partitions in: from the turn,
// which each claim moves on, so claims spread over the partitions.
func (cl *Cluster) rotation() []int {
	n := len(cl.parts)
	start := int(cl.turn.Add(1))
	order := make([]int, n)
	for k := range order {
		order[k] = (start + k) & (n - 1)
	}
	return order
}

// Claim claims from the partitions in rotation until one leases, so it
// comes back empty only when no partition it could reach has claimable
// work. A partition whose claim fails is passed over: the error is
// returned only when no other partition leased.
func (cl *Cluster) Claim(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	if c := cl.one(); c != nil {
		return c.Claim(ctx, workerID, visibility, minPriority)
	}
	got, err := cl.ClaimUpTo(ctx, workerID, visibility, minPriority, 1)
	if len(got) == 0 {
		return nil, err
	}
	return got[0], nil
}

// ClaimMany claims up to max leases, partition after partition in
// rotation until it has max or has asked each: fewer only when the
// partitions it could reach had no more claimable groups. Errors as Claim.
func (cl *Cluster) ClaimMany(ctx context.Context, workerID string, visibility time.Duration, minPriority, max int) ([]*pgtransport.Lease, error) {
	if c := cl.one(); c != nil {
		return c.ClaimMany(ctx, workerID, visibility, minPriority, max)
	}
	if err := core.CheckBatch(max); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	return cl.ClaimUpTo(ctx, workerID, visibility, minPriority, max)
}

// ClaimUpTo is ClaimMany with max unchecked (1 for Claim).
func (cl *Cluster) ClaimUpTo(ctx context.Context, workerID string, visibility time.Duration, minPriority, max int) ([]*pgtransport.Lease, error) {
	if err := core.CheckClaim(workerID, visibility, minPriority); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	var (
		got   []*pgtransport.Lease
		first error
	)
	for _, i := range cl.rotation() {
		if err := ctx.Err(); err != nil {
			first = cmp.Or(first, fmt.Errorf("claim: %w", err))
			break
		}
		var (
			ls  []*pgtransport.Lease
			err error
		)
		if max == 1 {
			var l *pgtransport.Lease
			if l, err = cl.parts[i].Claim(ctx, workerID, visibility, minPriority); l != nil {
				ls = []*pgtransport.Lease{l}
			}
		} else {
			ls, err = cl.parts[i].ClaimMany(ctx, workerID, visibility, minPriority, max-len(got))
		}
		if err != nil {
			first = cmp.Or(first, fmt.Errorf("partition %d: %w", i, err))
			continue
		}
		if got = append(got, ls...); len(got) == max {
			break
		}
	}
	if len(got) > 0 {
		return got, nil
	}
	return nil, first
}

// ClaimWait is Claim that waits for work. It claims once in rotation,
// returning the lease, or the error when every partition's claim failed;
// then it waits on every partition at once (each as
// Core.ClaimWaitDetached) and returns the first lease as soon as it comes.
// A lease another partition hands out after that, or after ctx ended, is
// given back (not counted as an attempt) by the goroutine that got it,
// which the Cluster owns until then (Close): a partition that is slow to
// answer delays neither the lease nor the caller. A partition whose wait
// fails is tried again after a pause (logged at Warn) while the others are
// waited on, so one partition down holds up nothing the others have. It
// returns ErrClosed once every partition's Core is closed, and ctx's error
// when ctx ends.
func (cl *Cluster) ClaimWait(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	if c := cl.one(); c != nil {
		return c.ClaimWait(ctx, workerID, visibility, minPriority)
	}
	if err := core.CheckClaim(workerID, visibility, minPriority); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	var (
		first  error
		failed int
	)
	for _, i := range cl.rotation() {
		l, err := cl.parts[i].Claim(ctx, workerID, visibility, minPriority)
		if l != nil && cl.parts[i].Parking().Closed() { // Close began meanwhile: the lease goes back, as on one database
			cl.parts[i].GiveBack(ctx, l)
			return nil, fmt.Errorf("claim: %w", pgtransport.ErrClosed)
		}
		if l != nil {
			return l, nil
		}
		if err != nil {
			if errors.Is(err, pgtransport.ErrClosed) || ctx.Err() != nil {
				return nil, err
			}
			first, failed = cmp.Or(first, fmt.Errorf("partition %d: %w", i, err)), failed+1
		}
	}
	if failed == len(cl.parts) {
		return nil, first
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()        // the other waits end; the Cluster owns them until they have
	var taken atomic.Bool // a lease is the caller's, or the caller has gone: any other goes back
	results := make(chan waitResult, len(cl.parts))
	if !cl.startWaits(func(i int) { cl.wait(ctx, wctx, i, &taken, results, workerID, visibility, minPriority) }) {
		return nil, fmt.Errorf("claim: %w", pgtransport.ErrClosed)
	}
	closed := 0
	for range cl.parts {
		select {
		case r := <-results:
			switch {
			case r.l != nil:
				return r.l, nil
			case errors.Is(r.err, pgtransport.ErrClosed):
				if closed++; closed == len(cl.parts) {
					return nil, fmt.Errorf("claim: %w", pgtransport.ErrClosed)
				}
			}
		case <-ctx.Done():
			if !taken.CompareAndSwap(false, true) {
				return cl.lateLease(ctx, results)
			}
			return nil, fmt.Errorf("claim: %w", ctx.Err())
		}
	}
	return nil, fmt.Errorf("claim: %w", cmp.Or(ctx.Err(), context.Canceled))
}

// startWaits starts wait(i) for every partition, on goroutines the
// Cluster owns (Close waits for them); false, starting none, once Close
// has begun.
func (cl *Cluster) startWaits(wait func(i int)) bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.closing {
		return false
	}
	for i := range cl.parts {
		cl.waits.Go(func() { wait(i) })
	}
	return true
}

// wait is ClaimWait's wait on partition i, until it has a lease (the
// caller's, unless taken says another won or the caller has gone: then it
// gives it back), the partition's Core is closed, or wctx ends. A failed
// claim is tried again after a pause, logged.
func (cl *Cluster) wait(ctx, wctx context.Context, i int, taken *atomic.Bool, results chan<- waitResult, workerID string, visibility time.Duration, minPriority int) {
	c := cl.parts[i]
	pause := 50 * time.Millisecond
	for {
		l, err := c.ClaimWaitDetached(wctx, workerID, visibility, minPriority)
		if l != nil && !taken.CompareAndSwap(false, true) {
			c.GiveBack(context.WithoutCancel(ctx), l) // another partition's lease won
			results <- waitResult{}
			return
		}
		if l != nil || errors.Is(err, pgtransport.ErrClosed) || wctx.Err() != nil {
			results <- waitResult{l, err}
			return
		}
		c.Logger().Warn("pgtransport: a partition's claim failed; waiting on the others, trying it again",
			"partition", i, "err", err, "retry_in", pause)
		select {
		case <-wctx.Done():
			results <- waitResult{nil, wctx.Err()}
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, 2*time.Second)
	}
}

// waitResult is what one partition's wait in ClaimWait came to.
type waitResult struct {
	l   *pgtransport.Lease
	err error
}

// lateLease is ClaimWait's answer when ctx ended just as a partition's
// wait took a lease: that lease, on its way in results, is given back.
func (cl *Cluster) lateLease(ctx context.Context, results <-chan waitResult) (*pgtransport.Lease, error) {
	for r := range results {
		if r.l != nil {
			cl.parts[cl.Of(r.l)].GiveBack(context.WithoutCancel(ctx), r.l)
			break
		}
	}
	return nil, fmt.Errorf("claim: %w", ctx.Err())
}
