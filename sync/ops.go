package sync

import (
	"context"

	"github.com/pgtransport/pgtransport"
)

// The operator's calls (schema version 11): see the queue, page through
// its groups, look at a group's next messages, and pause, resume or purge
// a group. Each checks its arguments before any round-trip (a bad one is
// a typed error and nothing is read or written), then makes one
// round-trip, one transaction. A group's state, LeasedAt and Until are by
// the clock the claims use (Config.Clock, else the database server's); ages
// and Stats.At by the server's clock, as the publish times are.

// Stats returns the queue at a glance: per priority and in total, the
// groups in each state, the messages, the oldest head's age and the dead
// letters, and the idle consumers waiting. Leased, parked, stopped and
// paused groups are exact; all groups, messages and dead letters are
// exact up to 100,000 rows, then estimated from a sample, as each Exact
// field says (see pgtransport.Stats). A read. One round-trip.
func (t *Transport) Stats(ctx context.Context) (pgtransport.Stats, error) {
	if err := t.check("stats"); err != nil {
		return pgtransport.Stats{}, err
	}
	return t.cl.Stats(ctx)
}

// Groups returns a page of the queue's groups: those in q.State (""
// every state) of q.Tenant ("" every tenant), in q.Order (see
// pgtransport.GroupOrder), after skipping q.Offset, at most q.Limit (0:
// pgtransport.DefaultGroupLimit). Page on with Offset grown by the rows
// seen; a group whose state or place changes between two pages may be
// missed or seen twice. An unknown State or Order, or a negative Offset
// or Limit: ErrInvalidQuery; a Limit past pgtransport.MaxBatch:
// ErrInvalidBatch; a Tenant that is no tenant id: ErrInvalidTenant; all
// with no round-trip. A read. One round-trip.
func (t *Transport) Groups(ctx context.Context, q pgtransport.GroupQuery) ([]pgtransport.GroupInfo, error) {
	if err := t.check("groups"); err != nil {
		return nil, err
	}
	return t.cl.Groups(ctx, q)
}

// Group returns one group as Groups lists it: its state, holder (the
// lease token), when the holder took it and until when, its head and the
// head's attempts so far. ErrUnknownGroup if the group has no row (never
// published to, or drained and not paused); ErrInvalidGroup for an empty
// id or one holding NUL. A read. One round-trip.
func (t *Transport) Group(ctx context.Context, group string) (pgtransport.GroupInfo, error) {
	c, err := t.group(ctx, "group", group)
	if err != nil {
		return pgtransport.GroupInfo{}, err
	}
	return c.Group(ctx, group)
}

// Peek returns the group's next n messages (n from 1 to
// pgtransport.MaxBatch, else ErrInvalidBatch), head first, without leasing
// them: nothing changes, and the next claim hands out the head as if Peek
// had not run. ErrUnknownGroup if the group has no row and no message;
// ErrInvalidGroup as Group. A read. One round-trip.
func (t *Transport) Peek(ctx context.Context, group string, n int) ([]pgtransport.PeekedMessage, error) {
	c, err := t.group(ctx, "peek", group)
	if err != nil {
		return nil, err
	}
	return c.Peek(ctx, group, n)
}

// PauseGroup pauses group: from its commit no claim hands it out (Claim,
// ClaimMany, ClaimWait, streams, Work, AckNext's keep, plain SQL), until
// ResumeGroup; it keeps its messages and its row, even once they are all
// gone. A holder mid-message keeps its lease and may still Ack, Nack,
// Extend or Fail it; the group is then not handed on. Pausing a paused
// group changes nothing. ErrUnknownGroup if the group has no row;
// ErrInvalidGroup as Group. One round-trip.
//
// A lost reply (ErrOutcomeUnknown): paused or not; pausing again makes
// sure.
func (t *Transport) PauseGroup(ctx context.Context, group string) error {
	c, err := t.group(ctx, "pause group", group)
	if err != nil {
		return err
	}
	return c.PauseGroup(ctx, group)
}

// ResumeGroup puts a paused group back into the round-robin, its messages
// in their order, and wakes idle consumers; a group that drained while
// paused is gone after it (Group then returns ErrUnknownGroup). Resuming a
// group that is not paused changes nothing. ErrUnknownGroup if the group has no row;
// ErrInvalidGroup as Group. One round-trip.
//
// A lost reply (ErrOutcomeUnknown): resumed or not; resuming again makes
// sure.
func (t *Transport) ResumeGroup(ctx context.Context, group string) error {
	c, err := t.group(ctx, "resume group", group)
	if err != nil {
		return err
	}
	return c.ResumeGroup(ctx, group)
}

// PurgeGroup deletes group's oldest limit messages (0: all of them;
// negative: ErrInvalidBatch) and returns how many. It ends any lease, park
// or stop on the group: the holder's later Ack, Nack, Extend or Fail
// returns ErrLeaseLost, and a message it was handling is gone. A paused
// group stays paused. Messages published after it commits are kept, so a
// concurrent publisher loses nothing it publishes after the call returns.
// ErrUnknownGroup if the group has no row; ErrInvalidGroup as Group. One
// round-trip, one transaction.
//
// A purge with a limit that leaves messages frees the group (and wakes
// idle consumers): to delete a deep group in batches without a consumer
// taking it between two of them, pause it first and resume it after (the
// pgtransport command's purge and the dashboard do).
//
// A lost reply (ErrOutcomeUnknown): purged or not; a purge with a limit
// may then delete up to limit more if called again.
func (t *Transport) PurgeGroup(ctx context.Context, group string, limit int) (int64, error) {
	c, err := t.group(ctx, "purge group", group)
	if err != nil {
		return 0, err
	}
	return c.PurgeGroup(ctx, group, limit)
}

// SetPolicy makes p the queue's policy (see pgtransport.Policy): whole,
// a zero field its default. It is kept in the database, so every consumer
// of the queue applies it from its next decision on, plain-SQL ones
// included; over partitions it is written on each, at once, not
// atomically across (an error names the partitions that failed: set it
// again). A bad p is ErrInvalidConfig, and nothing is written. Needs a
// role that may update transport_policy (the queue's owner, not a
// worker's: docs/operating.md, "Least privilege").
func (t *Transport) SetPolicy(ctx context.Context, p pgtransport.Policy) error {
	if err := t.check("set policy"); err != nil {
		return err
	}
	return t.cl.SetPolicy(ctx, p)
}

// Policy returns the queue's policy as stored (MaxAttempts Unlimited for
// a queue that never exhausts a message).
func (t *Transport) Policy(ctx context.Context) (pgtransport.Policy, error) {
	if err := t.check("policy"); err != nil {
		return pgtransport.Policy{}, err
	}
	return t.cl.Policy(ctx)
}

// SetTenantWeight sets tenant's weight, 1 to pgtransport.MaxTenantWeight
// (a tenant never set weighs 1): under contention, each tenant with
// ready groups is handed out in proportion to its weight, however many
// groups it has (see pgtransport.Message.Tenant). It is kept in the
// database, so every consumer applies it, plain-SQL ones included, to the
// tenant's groups from their next turn on; over partitions it is written
// on each, at once, not atomically across. An empty or bad tenant is
// ErrInvalidTenant, a weight out of range ErrInvalidWeight, and nothing is
// written. One round-trip.
func (t *Transport) SetTenantWeight(ctx context.Context, tenant string, weight int) error {
	if err := t.check("set tenant weight"); err != nil {
		return err
	}
	return t.cl.SetTenantWeight(ctx, tenant, weight)
}

// Tenants lists the tenants that have groups, a weight or deliveries
// counted, in tenant order, each with its weight, groups, leased groups,
// groups waiting their turn, share and deliveries so far (see
// pgtransport.TenantInfo; pgtransport.Rates turns two readings into
// rates). It reads every group row: an operator's call. A read. One
// round-trip.
func (t *Transport) Tenants(ctx context.Context) ([]pgtransport.TenantInfo, error) {
	if err := t.check("tenants"); err != nil {
		return nil, err
	}
	return t.cl.Tenants(ctx)
}
