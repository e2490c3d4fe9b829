package sync

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
)

// DBTX is the connection a Transport runs on: a *pgxpool.Pool (safe for
// concurrent use), a *pgx.Conn (one goroutine at a time) or a pgx.Tx.
type DBTX = core.DBTX

// Transport is the blocking transport. It is safe for concurrent use when its
// DBTX is (a pool is).
type Transport struct {
	core  *core.Core
	owned *pgxpool.Pool // closed by Close; set by FromDSN only
}

// New returns a Transport on db. Unless cfg.SkipApply, it first brings the
// schema up to date (idempotent; safe from many workers at once).
func New(ctx context.Context, db DBTX, cfg pgtransport.Config) (*Transport, error) {
	c, err := core.New(ctx, db, cfg)
	if err != nil {
		return nil, err
	}
	return &Transport{core: c}, nil
}

// FromDSN connects to dsn with a pool and returns a Transport that owns it.
// While the server does not accept connections it retries with exponential
// backoff, so a worker started beside PostgreSQL waits for it; it gives up
// when ctx ends or cfg.MaxConnectWait passes, with an error that wraps both
// the reason it stopped and the last connection error. A malformed dsn fails
// at once.
func FromDSN(ctx context.Context, dsn string, cfg pgtransport.Config) (*Transport, error) {
	t, pool, err := core.FromDSN(ctx, dsn, cfg, func(pool *pgxpool.Pool, cfg pgtransport.Config) (*Transport, error) {
		return New(ctx, pool, cfg)
	})
	if err != nil {
		return nil, err
	}
	t.owned = pool
	return t, nil
}

// Close releases the pool FromDSN opened. It does nothing for a Transport
// made with New (the caller owns that connection) and is safe to call twice.
func (t *Transport) Close() {
	if t.owned != nil {
		t.owned.Close()
	}
}

// Publish appends event to group's FIFO and returns its seq. A new group gets
// priority (0-4); an existing one keeps its priority and any live lease. One
// round-trip.
func (t *Transport) Publish(ctx context.Context, group, event string, priority int) (int64, error) {
	return t.core.Publish(ctx, t.db(), group, event, priority)
}

// PublishTx is Publish inside the caller's transaction: the message commits
// or rolls back with the caller's own writes, and is invisible to claims
// until then.
func (t *Transport) PublishTx(ctx context.Context, tx pgx.Tx, group, event string, priority int) (int64, error) {
	if tx == nil {
		return 0, fmt.Errorf("publish: %w: nil transaction", pgtransport.ErrInvalidConfig)
	}
	return t.core.Publish(ctx, tx, group, event, priority)
}

// Claim leases the claimable group (priority >= minPriority) that was served
// longest ago and returns its head, held for visibility. It returns nil, nil
// when nothing is claimable; it does not wait for work. One round-trip.
func (t *Transport) Claim(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	return t.core.Claim(ctx, workerID, visibility, minPriority)
}

// Ack deletes the lease's message and frees its group for the next claim (or
// deletes the group's row when it has no message left). ErrLeaseLost if the
// lease no longer holds. One round-trip.
func (t *Transport) Ack(ctx context.Context, lease *pgtransport.Lease) error {
	return t.core.Ack(ctx, lease)
}

// Nack gives the lease back without deleting the message. delay > 0 parks the
// group until now+delay (the message stays its head; the token still holds
// it); delay == 0 frees it at once, first in line. ErrLeaseLost if the lease
// no longer holds. One round-trip.
func (t *Transport) Nack(ctx context.Context, lease *pgtransport.Lease, delay time.Duration) error {
	return t.core.Nack(ctx, lease, delay)
}

// Extend makes the lease hold until now+visibility, for handlers that run
// long. ErrLeaseLost if the lease no longer holds. One round-trip.
func (t *Transport) Extend(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) error {
	return t.core.Extend(ctx, lease, visibility)
}

func (t *Transport) db() DBTX { return t.core.DB() }
