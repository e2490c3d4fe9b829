package core

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/pgtransport/pgtransport"
)

// The dead letters (messages that used their attempts, policy
// DeadLetterHead) and stopped groups (policy StopGroup): what an operator
// does with them. Each call is one round-trip and one transaction.

// DeadLetters returns a page of dead letters in seq order: those of
// q.Group ("" all), with seq after q.After, at most q.Limit (0:
// DefaultDeadLetterLimit; at most MaxBatch). A read: it changes nothing.
func (c *Core) DeadLetters(ctx context.Context, q pgtransport.DeadLetterQuery) ([]pgtransport.DeadLetter, error) {
	if q.Limit < 0 || q.Limit > pgtransport.MaxBatch {
		return nil, fmt.Errorf("dead letters: %w: Limit %d, want 0 (%d) to %d", pgtransport.ErrInvalidBatch, q.Limit, pgtransport.DefaultDeadLetterLimit, pgtransport.MaxBatch)
	}
	group, err := groupFilter(q.Group)
	if err != nil {
		return nil, fmt.Errorf("dead letters: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dead letters: %w", err)
	}
	var after *int64
	if q.After != 0 {
		after = &q.After
	}
	rows, err := c.db.Query(ctx, c.q.deadLetters, group, after, cmp.Or(q.Limit, pgtransport.DefaultDeadLetterLimit))
	if err != nil {
		return nil, mapErr("dead letters", err)
	}
	defer rows.Close()
	var out []pgtransport.DeadLetter
	for rows.Next() {
		var (
			d         pgtransport.DeadLetter
			lastError *string
			published *time.Time
		)
		if err := rows.Scan(&d.Seq, &d.Group, &d.Event, &d.Priority, &d.Attempts, &lastError, &published, &d.DiedAt); err != nil {
			return nil, mapErr("dead letters", err)
		}
		if lastError != nil {
			d.LastError = *lastError
		}
		if published != nil {
			d.PublishedAt = *published
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, mapErr("dead letters", err)
	}
	return out, nil
}

// Redrive puts the dead letters f selects back, each at the head of its
// group with its own seq (so in their original order, ahead of anything
// queued after them), recreating a group that drained meanwhile with the
// priority it had; it returns how many. Each is a fresh message: its
// attempts start again. It wakes a parked caller per message put back.
func (c *Core) Redrive(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error) {
	n, err := c.deadLetterCall(ctx, "redrive", c.q.redrive, f)
	if err == nil {
		c.parking.Wake(int(min(n, int64(pgtransport.MaxBatch))))
	}
	return n, err
}

// PurgeDeadLetters deletes the dead letters f selects for good and returns
// how many.
func (c *Core) PurgeDeadLetters(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error) {
	return c.deadLetterCall(ctx, "purge dead letters", c.q.purge, f)
}

// deadLetterCall runs a statement that takes a filter's group and seqs
// (NULL: all) and answers a count. A non-nil empty Seqs selects nothing:
// 0, with no round-trip.
func (c *Core) deadLetterCall(ctx context.Context, op, sql string, f pgtransport.DeadLetterFilter) (int64, error) {
	if len(f.Seqs) > pgtransport.MaxBatch {
		return 0, fmt.Errorf("%s: %w: %d seqs, the limit is %d", op, pgtransport.ErrInvalidBatch, len(f.Seqs), pgtransport.MaxBatch)
	}
	group, err := groupFilter(f.Group)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	var seqs any // NULL: every seq
	switch {
	case f.Seqs == nil:
	case len(f.Seqs) == 0:
		return 0, nil
	default:
		seqs = f.Seqs
	}
	var n int64
	if err := c.db.QueryRow(ctx, sql, group, seqs).Scan(&n); err != nil {
		return 0, mapErr(op, err)
	}
	return n, nil
}

// RestartGroup puts a stopped group (policy StopGroup) back into the
// round-robin with fresh attempts; with skipHead its head is dead-lettered
// first, so the group goes on with its next message. ErrGroupNotStopped
// when the group is not stopped (nothing changed). It wakes one parked
// caller.
func (c *Core) RestartGroup(ctx context.Context, group string, skipHead bool) error {
	if err := checkStoredGroup(group); err != nil {
		return fmt.Errorf("restart group: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("restart group: %w", err)
	}
	var restarted bool
	if err := c.db.QueryRow(ctx, c.q.restart, group, skipHead).Scan(&restarted); err != nil {
		return mapErr("restart group", err)
	}
	if !restarted {
		return fmt.Errorf("restart group: %w: %q", pgtransport.ErrGroupNotStopped, group)
	}
	c.parking.Wake(1)
	return nil
}

// groupFilter is a filter's group as a parameter: nil (every group) for "".
func groupFilter(group string) (*string, error) {
	if group == "" {
		return nil, nil
	}
	if err := checkStoredGroup(group); err != nil {
		return nil, err
	}
	return &group, nil
}
