package cluster

import (
	"context"
	"fmt"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
)

// Home is the partition of group: Hashtext(group) & (N-1), as PL/Proxy's
// RUN ON hashtext(group). While the cluster grows, a group may still live
// in its old home: Locate.
func (cl *Cluster) Home(group string) int { return int(Hashtext(group)) & (len(cl.parts) - 1) }

// first is the partition a publish of group tries first: its home, or
// while the cluster grows its home before (the same for a group that does
// not move).
func (cl *Cluster) first(group string) int {
	if cl.from == 0 {
		return cl.Home(group)
	}
	return int(Hashtext(group)) & (cl.from - 1)
}

// Moves reports whether the cluster grows and group, a valid group id,
// is one whose home changed: its calls then locate it first (Locate), and
// its publishes try its old home first. An invalid id never moves, so
// its call goes to its Home, which refuses it (ErrInvalidGroup) before
// anything is sent.
func (cl *Cluster) Moves(group string) bool {
	return cl.first(group) != cl.Home(group) && core.CheckGroup(group) == nil
}

// Locate is the partition that holds group now: Home, but while the
// cluster grows and the group moves, its old home as long as it has
// anything there (a message, a lease, a dead letter, a kept state, a
// dedup key), which takes a round-trip to that partition. A group found
// in its new home stays there; one found in its old home may leave it as
// soon as its last message is acked. An invalid group id is
// ErrInvalidGroup, with nothing sent.
func (cl *Cluster) Locate(ctx context.Context, group string) (int, error) {
	if err := core.CheckGroup(group); err != nil {
		return 0, fmt.Errorf("locate: %w", err)
	}
	home, old := cl.Home(group), cl.first(group)
	if old == home {
		return home, nil
	}
	here, err := cl.parts[old].Here(ctx, []string{group})
	if err != nil {
		return 0, fmt.Errorf("partition %d: %w", old, err)
	}
	if len(here) > 0 {
		return old, nil
	}
	return home, nil
}

// Of is the partition of the message seq (a lease's Seq, a dead letter's):
// seq & (N-1). A lease of nil goes to partition 0, which refuses it.
func (cl *Cluster) Of(l *pgtransport.Lease) int {
	if l == nil {
		return 0
	}
	return cl.OfSeq(l.Seq)
}

// OfSeq is the partition of the message seq.
func (cl *Cluster) OfSeq(seq int64) int { return int(seq) & (len(cl.parts) - 1) }
