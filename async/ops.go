package async

import (
	"context"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
)

// The operator's calls, each the twin of sync.Transport's: one
// round-trip, its result delivered on a buffered channel.

// Stats delivers the queue at a glance; as sync.Transport.Stats.
func (t *Transport) Stats(ctx context.Context) <-chan Result[pgtransport.Stats] {
	return call(t, ctx, func(ctx context.Context) (pgtransport.Stats, error) {
		return t.cl.Stats(ctx)
	})
}

// Groups delivers a page of the queue's groups; as sync.Transport.Groups
// (ErrInvalidQuery, ErrInvalidBatch, ErrInvalidTenant with no
// round-trip).
func (t *Transport) Groups(ctx context.Context, q pgtransport.GroupQuery) <-chan Result[[]pgtransport.GroupInfo] {
	return call(t, ctx, func(ctx context.Context) ([]pgtransport.GroupInfo, error) {
		return t.cl.Groups(ctx, q)
	})
}

// Group delivers one group; ErrUnknownGroup if it has no row. As
// sync.Transport.Group.
func (t *Transport) Group(ctx context.Context, group string) <-chan Result[pgtransport.GroupInfo] {
	return onGroup(t, ctx, group, func(ctx context.Context, c *core.Core) (pgtransport.GroupInfo, error) {
		return c.Group(ctx, group)
	})
}

// Peek delivers the group's next n messages without leasing them; as
// sync.Transport.Peek.
func (t *Transport) Peek(ctx context.Context, group string, n int) <-chan Result[[]pgtransport.PeekedMessage] {
	return onGroup(t, ctx, group, func(ctx context.Context, c *core.Core) ([]pgtransport.PeekedMessage, error) {
		return c.Peek(ctx, group, n)
	})
}

// PauseGroup pauses group: no claim or stream hands it out until
// ResumeGroup. As sync.Transport.PauseGroup.
//
// A lost reply: ErrOutcomeUnknown, as there.
func (t *Transport) PauseGroup(ctx context.Context, group string) <-chan error {
	return onGroupErr(t, ctx, group, func(ctx context.Context, c *core.Core) error {
		return c.PauseGroup(ctx, group)
	})
}

// ResumeGroup puts a paused group back into the round-robin and wakes
// idle consumers; as sync.Transport.ResumeGroup.
//
// A lost reply: ErrOutcomeUnknown, as there.
func (t *Transport) ResumeGroup(ctx context.Context, group string) <-chan error {
	return onGroupErr(t, ctx, group, func(ctx context.Context, c *core.Core) error {
		return c.ResumeGroup(ctx, group)
	})
}

// PurgeGroup deletes up to limit (0: all) of group's oldest messages,
// fencing off its holder, and delivers how many; as
// sync.Transport.PurgeGroup.
//
// A lost reply: ErrOutcomeUnknown, as there.
func (t *Transport) PurgeGroup(ctx context.Context, group string, limit int) <-chan Result[int64] {
	return onGroup(t, ctx, group, func(ctx context.Context, c *core.Core) (int64, error) {
		return c.PurgeGroup(ctx, group, limit)
	})
}

// SetPolicy makes p the queue's policy, whole (a zero field its
// default); as sync.Transport.SetPolicy.
func (t *Transport) SetPolicy(ctx context.Context, p pgtransport.Policy) <-chan error {
	return callErr(t, ctx, func(ctx context.Context) error { return t.cl.SetPolicy(ctx, p) })
}

// Policy delivers the queue's policy as stored; as sync.Transport.Policy.
func (t *Transport) Policy(ctx context.Context) <-chan Result[pgtransport.Policy] {
	return call(t, ctx, func(ctx context.Context) (pgtransport.Policy, error) { return t.cl.Policy(ctx) })
}

// SetTenantWeight sets tenant's weight; as sync.Transport.SetTenantWeight
// (ErrInvalidTenant, ErrInvalidWeight with no round-trip).
func (t *Transport) SetTenantWeight(ctx context.Context, tenant string, weight int) <-chan error {
	return callErr(t, ctx, func(ctx context.Context) error { return t.cl.SetTenantWeight(ctx, tenant, weight) })
}

// Tenants delivers the tenants; as sync.Transport.Tenants.
func (t *Transport) Tenants(ctx context.Context) <-chan Result[[]pgtransport.TenantInfo] {
	return call(t, ctx, func(ctx context.Context) ([]pgtransport.TenantInfo, error) { return t.cl.Tenants(ctx) })
}
