package core

import (
	"cmp"
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
// included. It changes only by an explicit call: SetPolicy, or
// Config.Policy on open.

// policy is transport_policy's row.
type policy struct {
	maxAttempts            int32  // 0: never exhausted
	onExhausted            string // "dead_letter" or "stop"
	backoffMin, backoffMax float64
	stateRetention         float64 // seconds; 0: a drained group's state is not kept
}

// CheckPolicy checks p's fields against their ranges (see
// pgtransport.Policy): ErrInvalidConfig naming the field.
func CheckPolicy(p pgtransport.Policy) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: policy: "+format, append([]any{pgtransport.ErrInvalidConfig}, args...)...)
	}
	if p.MaxAttempts < pgtransport.Unlimited || p.MaxAttempts > math.MaxInt32 {
		return bad("MaxAttempts %d, want -1 (Unlimited), 0 (%d) or 1 to %d", p.MaxAttempts, pgtransport.DefaultMaxAttempts, math.MaxInt32)
	}
	for _, b := range []struct {
		name string
		d    time.Duration
	}{{"RetryBackoffMin", p.RetryBackoffMin}, {"RetryBackoffMax", p.RetryBackoffMax}} {
		if b.d != 0 && (b.d < pgtransport.MinRetryBackoff || b.d > pgtransport.MaxRetryBackoff) {
			return bad("%s %v, want 0 (the default) or %v to %v", b.name, b.d, pgtransport.MinRetryBackoff, pgtransport.MaxRetryBackoff)
		}
	}
	if r := row(p); r.backoffMin > r.backoffMax {
		return bad("the retry backoff would run from %gs to %gs: RetryBackoffMin above RetryBackoffMax (a zero bound is its default: %v, %v)",
			r.backoffMin, r.backoffMax, pgtransport.DefaultRetryBackoffMin, pgtransport.DefaultRetryBackoffMax)
	}
	switch p.OnExhausted {
	case "", pgtransport.DeadLetterHead, pgtransport.StopGroup:
	default:
		return bad("OnExhausted %q, want %q (or \"\"), or %q", p.OnExhausted, pgtransport.DeadLetterHead, pgtransport.StopGroup)
	}
	if p.StateRetention < 0 || p.StateRetention > pgtransport.MaxStateRetention {
		return bad("StateRetention %v, want 0 (none) to %v", p.StateRetention, pgtransport.MaxStateRetention)
	}
	return nil
}

// row is p's transport_policy row: each zero field its default.
func row(p pgtransport.Policy) policy {
	r := policy{
		maxAttempts:    int32(cmp.Or(p.MaxAttempts, pgtransport.DefaultMaxAttempts)),
		onExhausted:    string(cmp.Or(p.OnExhausted, pgtransport.DeadLetterHead)),
		backoffMin:     cmp.Or(p.RetryBackoffMin, pgtransport.DefaultRetryBackoffMin).Seconds(),
		backoffMax:     cmp.Or(p.RetryBackoffMax, pgtransport.DefaultRetryBackoffMax).Seconds(),
		stateRetention: p.StateRetention.Seconds(),
	}
	if p.MaxAttempts == pgtransport.Unlimited {
		r.maxAttempts = 0
	}
	return r
}

// asPolicy is the Policy r stores.
func (r policy) asPolicy() pgtransport.Policy {
	p := pgtransport.Policy{
		MaxAttempts:     int(r.maxAttempts),
		OnExhausted:     pgtransport.Exhausted(r.onExhausted),
		RetryBackoffMin: time.Duration(r.backoffMin * float64(time.Second)),
		RetryBackoffMax: time.Duration(r.backoffMax * float64(time.Second)),
		StateRetention:  time.Duration(r.stateRetention * float64(time.Second)),
	}
	if r.maxAttempts == 0 {
		p.MaxAttempts = pgtransport.Unlimited
	}
	return p
}

// Policy reads the queue's policy: every field as stored (MaxAttempts
// Unlimited for a queue that never exhausts).
func (c *Core) Policy(ctx context.Context) (pgtransport.Policy, error) {
	cur, err := readPolicy(ctx, c.db, c.q)
	if err != nil {
		return pgtransport.Policy{}, err
	}
	return cur.asPolicy(), nil
}

// SetPolicy makes p the queue's policy, whole (a zero field its default).
// A bad p is ErrInvalidConfig, and nothing is written.
func (c *Core) SetPolicy(ctx context.Context, p pgtransport.Policy) error {
	if err := CheckPolicy(p); err != nil {
		return fmt.Errorf("set policy: %w", err)
	}
	return setPolicy(ctx, c.db, c.q, p)
}

func readPolicy(ctx context.Context, db DBTX, q statements) (policy, error) {
	var cur policy
	err := db.QueryRow(ctx, q.policyGet).Scan(&cur.maxAttempts, &cur.onExhausted, &cur.backoffMin, &cur.backoffMax, &cur.stateRetention)
	if errors.Is(err, pgx.ErrNoRows) {
		return cur, fmt.Errorf("policy: %w: transport_policy has no row", pgtransport.ErrSchemaMissing)
	}
	if err != nil {
		return cur, mapErr("policy", err)
	}
	return cur, nil
}

// setPolicy writes p (checked) as the queue's policy: one read and, only
// when the stored row differs, one UPDATE. So a process opened with the
// policy already in place writes nothing (its role need not be allowed
// to).
func setPolicy(ctx context.Context, db DBTX, q statements, p pgtransport.Policy) error {
	cur, err := readPolicy(ctx, db, q)
	if err != nil {
		return fmt.Errorf("set %w", err)
	}
	want := row(p)
	if want == cur {
		return nil
	}
	_, err = db.Exec(ctx, q.policySet, want.maxAttempts, want.onExhausted, want.backoffMin, want.backoffMax, want.stateRetention)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23514" { // check_violation: the table's own bounds
		return fmt.Errorf("set policy: %w: %w", pgtransport.ErrInvalidConfig, err)
	}
	if err != nil {
		return mapErr("set policy", withHint(err, "42501", "this role may not write the queue's policy: set it as the queue's owner (SetPolicy, or Config.Policy where the queue is owned), and leave Config.Policy nil in workers"))
	}
	return nil
}
