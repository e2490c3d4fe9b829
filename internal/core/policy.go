package core

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtransport/pgtransport"
)

// The queue's retry policy lives in the database (transport_policy, one
// row), so every consumer of the queue applies the same one, plain-SQL ones
// included. A Config sets fields of it; New writes those.

// policy is transport_policy's row.
type policy struct {
	maxAttempts            int32  // 0: never exhausted
	onExhausted            string // "dead_letter" or "stop"
	backoffMin, backoffMax float64
	stateRetention         float64 // seconds; 0: a drained group's state is not kept
}

// checkPolicy checks the policy and dedup fields of cfg (see
// pgtransport.Config for their ranges).
func checkPolicy(cfg pgtransport.Config) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{pgtransport.ErrInvalidConfig}, args...)...)
	}
	if cfg.MaxAttempts < pgtransport.Unlimited || cfg.MaxAttempts > math.MaxInt32 {
		return bad("MaxAttempts %d, want -1 (Unlimited), 0 (the queue's setting) or 1 to %d", cfg.MaxAttempts, math.MaxInt32)
	}
	for _, b := range []struct {
		name string
		d    time.Duration
	}{{"RetryBackoffMin", cfg.RetryBackoffMin}, {"RetryBackoffMax", cfg.RetryBackoffMax}} {
		if b.d != 0 && (b.d < pgtransport.MinRetryBackoff || b.d > pgtransport.MaxRetryBackoff) {
			return bad("%s %v, want 0 (the queue's setting) or %v to %v", b.name, b.d, pgtransport.MinRetryBackoff, pgtransport.MaxRetryBackoff)
		}
	}
	if cfg.RetryBackoffMin != 0 && cfg.RetryBackoffMax != 0 && cfg.RetryBackoffMin > cfg.RetryBackoffMax {
		return bad("RetryBackoffMin %v is above RetryBackoffMax %v", cfg.RetryBackoffMin, cfg.RetryBackoffMax)
	}
	switch cfg.OnExhausted {
	case "", pgtransport.DeadLetterHead, pgtransport.StopGroup:
	default:
		return bad("OnExhausted %q, want %q, %q or \"\" (the queue's setting)", cfg.OnExhausted, pgtransport.DeadLetterHead, pgtransport.StopGroup)
	}
	if cfg.StateRetention > pgtransport.MaxStateRetention {
		return bad("StateRetention %v, want 0 (the queue's setting), negative (none) or up to %v", cfg.StateRetention, pgtransport.MaxStateRetention)
	}
	if cfg.DedupWindow < 0 || cfg.DedupWindow > pgtransport.MaxDedupWindow {
		return bad("DedupWindow %v, want 0 (%v) to %v", cfg.DedupWindow, pgtransport.DefaultDedupWindow, pgtransport.MaxDedupWindow)
	}
	return nil
}

// setsPolicy reports whether cfg sets any field of the queue's policy.
func setsPolicy(cfg pgtransport.Config) bool {
	return cfg.MaxAttempts != 0 || cfg.RetryBackoffMin != 0 || cfg.RetryBackoffMax != 0 || cfg.OnExhausted != "" ||
		cfg.StateRetention != 0
}

// with is p with the fields cfg sets (a checked cfg) in place of its own.
func (p policy) with(cfg pgtransport.Config) policy {
	switch {
	case cfg.MaxAttempts == pgtransport.Unlimited:
		p.maxAttempts = 0
	case cfg.MaxAttempts > 0:
		p.maxAttempts = int32(cfg.MaxAttempts)
	}
	if cfg.OnExhausted != "" {
		p.onExhausted = string(cfg.OnExhausted)
	}
	if cfg.RetryBackoffMin != 0 {
		p.backoffMin = cfg.RetryBackoffMin.Seconds()
	}
	if cfg.RetryBackoffMax != 0 {
		p.backoffMax = cfg.RetryBackoffMax.Seconds()
	}
	if cfg.StateRetention != 0 {
		p.stateRetention = max(cfg.StateRetention.Seconds(), 0)
	}
	return p
}

// writePolicy writes the policy fields cfg sets into the queue's policy:
// one read and, only when a field differs from what is stored, one UPDATE
// of those fields alone. So a worker opened with the policy already in
// place writes nothing (its role need not be allowed to), and two
// transports that set different fields do not undo each other. A set
// bound that would cross the stored other one (RetryBackoffMin above the
// queue's max) is ErrInvalidConfig, and nothing is written.
func writePolicy(ctx context.Context, db DBTX, q statements, cfg pgtransport.Config) error {
	if !setsPolicy(cfg) {
		return nil
	}
	var cur policy
	err := db.QueryRow(ctx, q.policyGet).Scan(&cur.maxAttempts, &cur.onExhausted, &cur.backoffMin, &cur.backoffMax, &cur.stateRetention)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("write policy: %w: transport_policy has no row", pgtransport.ErrSchemaMissing)
	}
	if err != nil {
		return mapErr("write policy", err)
	}
	want := cur.with(cfg)
	if want.backoffMin > want.backoffMax {
		return fmt.Errorf("write policy: %w: the retry backoff would run from %gs to %gs (the queue holds %gs to %gs)",
			pgtransport.ErrInvalidConfig, want.backoffMin, want.backoffMax, cur.backoffMin, cur.backoffMax)
	}
	if want == cur {
		return nil
	}
	set := func(differs bool, v any) any {
		if differs {
			return v
		}
		return nil // COALESCE keeps the stored value
	}
	_, err = db.Exec(ctx, q.policySet,
		set(want.maxAttempts != cur.maxAttempts, want.maxAttempts),
		set(want.onExhausted != cur.onExhausted, want.onExhausted),
		set(want.backoffMin != cur.backoffMin, want.backoffMin),
		set(want.backoffMax != cur.backoffMax, want.backoffMax),
		set(want.stateRetention != cur.stateRetention, want.stateRetention))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23514" { // check_violation: the table's own bounds
		return fmt.Errorf("write policy: %w: %w", pgtransport.ErrInvalidConfig, err)
	}
	if err != nil {
		return mapErr("write policy", err)
	}
	return nil
}
