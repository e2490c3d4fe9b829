// Package purge deletes a group's messages in batches, as the command's
// purge and the dashboard's do, without handing the group to a consumer
// between two batches.
package purge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgtransport/pgtransport"
)

// Queue is what a purge needs of a transport (a *sync.Transport has it).
type Queue interface {
	Group(ctx context.Context, group string) (pgtransport.GroupInfo, error)
	PauseGroup(ctx context.Context, group string) error
	ResumeGroup(ctx context.Context, group string) error
	PurgeGroup(ctx context.Context, group string, limit int) (int64, error)
}

// resumeTimeout bounds the resume at the end, which runs even when ctx
// has ended (a Ctrl-C between batches).
const resumeTimeout = 10 * time.Second

// Paused runs f, the batches of a purge, with group paused, so that no
// consumer takes it between two batches (each PurgeGroup call ends any
// lease and frees the group), then resumes it: unless it was paused
// already, which it stays. The resume runs whatever f returns, ctx ended
// or not; if it fails, the error says the group is left paused. (Another
// operator who pauses the group while f runs sees it resumed at the end.)
func Paused(ctx context.Context, q Queue, group string, f func() error) error {
	g, err := q.Group(ctx, group)
	if err != nil {
		return err
	}
	if g.State == pgtransport.GroupPaused {
		return f()
	}
	if err := q.PauseGroup(ctx, group); err != nil {
		return err
	}
	ferr := f()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resumeTimeout)
	defer cancel()
	if err := q.ResumeGroup(rctx, group); err != nil {
		return errors.Join(ferr, fmt.Errorf("group %q is left paused (resume it: pgtransport resume): %w", group, err))
	}
	return ferr
}

// Batch deletes up to limit of group's oldest messages (one transaction)
// and reports how many, and whether the group is now empty (fewer than
// limit were left).
func Batch(ctx context.Context, q Queue, group string, limit int) (n int64, drained bool, err error) {
	n, err = q.PurgeGroup(ctx, group, limit)
	return n, err == nil && n < int64(limit), err
}
