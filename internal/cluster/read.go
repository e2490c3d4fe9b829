package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
)

// gather runs read on each of parts at once and returns the results in
// partition order, or the failed partitions' errors joined.
func gather[T any](parts []int, read func(i int) (T, error)) ([]T, error) {
	res := make([]T, len(parts))
	errs := make([]error, len(parts))
	idx := make(map[int]int, len(parts))
	for j, i := range parts {
		idx[i] = j
	}
	each(parts, func(i int) {
		j := idx[i]
		res[j], errs[j] = read(i)
		if errs[j] != nil {
			errs[j] = partitionErr(len(parts), i, errs[j])
		}
	})
	return res, errors.Join(errs...)
}

// DeadLetters returns a page of dead letters in seq order over every
// partition (q.Group's alone when it names one): each partition's first
// page after q.After, merged. Seqs of different partitions never collide,
// so the last Seq pages on as on one database.
func (cl *Cluster) DeadLetters(ctx context.Context, q pgtransport.DeadLetterQuery) ([]pgtransport.DeadLetter, error) {
	if c := cl.one(); c != nil {
		return c.DeadLetters(ctx, q)
	}
	parts := cl.all()
	if q.Group != "" {
		parts = cl.groupParts(q.Group)
	}
	pages, err := gather(parts, func(i int) ([]pgtransport.DeadLetter, error) { return cl.parts[i].DeadLetters(ctx, q) })
	if err != nil {
		return nil, err
	}
	out := slices.Concat(pages...)
	slices.SortFunc(out, func(a, b pgtransport.DeadLetter) int { return cmp.Compare(a.Seq, b.Seq) })
	return out[:min(len(out), cmp.Or(q.Limit, pgtransport.DefaultDeadLetterLimit))], nil
}

// Redrive is Core.Redrive over the partitions f can select on: its group's
// alone, or those its seqs are on, or every one; the counts added up.
func (cl *Cluster) Redrive(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error) {
	if c := cl.one(); c != nil {
		return c.Redrive(ctx, f)
	}
	return cl.deadLetterCall(f, func(i int, f pgtransport.DeadLetterFilter) (int64, error) { return cl.parts[i].Redrive(ctx, f) })
}

// PurgeDeadLetters is Core.PurgeDeadLetters over the partitions, as Redrive.
func (cl *Cluster) PurgeDeadLetters(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error) {
	if c := cl.one(); c != nil {
		return c.PurgeDeadLetters(ctx, f)
	}
	return cl.deadLetterCall(f, func(i int, f pgtransport.DeadLetterFilter) (int64, error) {
		return cl.parts[i].PurgeDeadLetters(ctx, f)
	})
}

func (cl *Cluster) deadLetterCall(f pgtransport.DeadLetterFilter, call func(int, pgtransport.DeadLetterFilter) (int64, error)) (int64, error) {
	switch {
	case f.Group != "":
		ns, err := gather(cl.groupParts(f.Group), func(i int) (int64, error) { return call(i, f) })
		return sum(ns), err
	case f.Seqs == nil:
		ns, err := gather(cl.all(), func(i int) (int64, error) { return call(i, f) })
		return sum(ns), err
	case len(f.Seqs) == 0 || len(f.Seqs) > pgtransport.MaxBatch:
		return call(0, f) // selects nothing, or refused: as one database answers
	}
	parts, items := split(len(f.Seqs), func(k int) int { return cl.OfSeq(f.Seqs[k]) })
	ns, err := gather(parts, func(i int) (int64, error) {
		seqs := make([]int64, len(items[i]))
		for j, k := range items[i] {
			seqs[j] = f.Seqs[k]
		}
		return call(i, pgtransport.DeadLetterFilter{Seqs: seqs})
	})
	return sum(ns), err
}

func sum(ns []int64) int64 {
	var t int64
	for _, n := range ns {
		t += n
	}
	return t
}

// Stats adds up every partition's Stats: counts summed, an exact flag
// true only if every partition's is, the oldest head age and At the
// largest.
func (cl *Cluster) Stats(ctx context.Context) (pgtransport.Stats, error) {
	if c := cl.one(); c != nil {
		return c.Stats(ctx)
	}
	all, err := gather(cl.all(), func(i int) (pgtransport.Stats, error) { return cl.parts[i].Stats(ctx) })
	if err != nil {
		return pgtransport.Stats{}, err
	}
	s := all[0]
	s.ByPriority = slices.Clone(s.ByPriority)
	for _, o := range all[1:] {
		if o.At.After(s.At) {
			s.At = o.At
		}
		s.Waiting += o.Waiting
		addStats(&s.Total, o.Total)
		for p := range min(len(s.ByPriority), len(o.ByPriority)) {
			addStats(&s.ByPriority[p], o.ByPriority[p])
		}
	}
	return s, nil
}

func addStats(s *pgtransport.PriorityStats, o pgtransport.PriorityStats) {
	s.Groups += o.Groups
	s.Free += o.Free
	s.Leased += o.Leased
	s.Parked += o.Parked
	s.Stopped += o.Stopped
	s.Paused += o.Paused
	s.GroupsExact = s.GroupsExact && o.GroupsExact
	s.Messages += o.Messages
	s.MessagesExact = s.MessagesExact && o.MessagesExact
	s.OldestHeadAge = max(s.OldestHeadAge, o.OldestHeadAge)
	s.OldestHeadExact = s.OldestHeadExact && o.OldestHeadExact
	s.DeadLetters += o.DeadLetters
	s.DeadLettersExact = s.DeadLettersExact && o.DeadLettersExact
}

// Groups returns a page of groups over every partition: each partition's
// first q.Offset + q.Limit in q.Order, merged in that order, and the page
// cut from that. OldestHead orders by the head's age across partitions (a
// seq says nothing of which of two partitions' messages came first); ties
// go by group id, as does ByGroup, in the database's collation (partition
// 0 sorts the ids: one more round-trip).
func (cl *Cluster) Groups(ctx context.Context, q pgtransport.GroupQuery) ([]pgtransport.GroupInfo, error) {
	if c := cl.one(); c != nil {
		return c.Groups(ctx, q)
	}
	if err := core.CheckGroupQuery(q); err != nil {
		return nil, fmt.Errorf("groups: %w", err)
	}
	limit := cmp.Or(q.Limit, pgtransport.DefaultGroupLimit)
	want := q.Offset + limit
	lists, err := gather(cl.all(), func(i int) ([]pgtransport.GroupInfo, error) {
		var out []pgtransport.GroupInfo
		for len(out) < want {
			page := pgtransport.GroupQuery{State: q.State, Tenant: q.Tenant, Order: q.Order, Offset: len(out), Limit: min(want-len(out), pgtransport.MaxBatch)}
			gs, err := cl.parts[i].Groups(ctx, page)
			if err != nil {
				return nil, err
			}
			out = append(out, gs...)
			if len(gs) < page.Limit {
				break
			}
		}
		return out, nil
	})
	if err != nil {
		return nil, err
	}
	out := slices.Concat(lists...)
	// Group ids compare as the partitions order them, by the database's
	// collation: partition 0 sorts the page's ids.
	ids := make([]string, len(out))
	for k, g := range out {
		ids[k] = g.Group
	}
	sorted, err := cl.parts[0].SortIDs(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("groups: %w", err)
	}
	rank := make(map[string]int, len(sorted))
	for k, g := range sorted {
		rank[g] = k
	}
	slices.SortStableFunc(out, groupOrder(q.Order, rank))
	if q.Offset >= len(out) {
		return nil, nil
	}
	return out[q.Offset:min(len(out), want)], nil
}

// groupOrder compares two groups in order o, as the proxy's harel_groups
// merges them, with rank the place of each group id in the database's
// collation.
func groupOrder(o pgtransport.GroupOrder, rank map[string]int) func(a, b pgtransport.GroupInfo) int {
	return func(a, b pgtransport.GroupInfo) int {
		var c int
		switch o {
		case pgtransport.HeldLongest:
			c = a.LeasedAt.Compare(b.LeasedAt)
		case pgtransport.MostAttempts:
			c = cmp.Compare(b.Attempts, a.Attempts)
		case pgtransport.OldestHead:
			c = cmp.Compare(b.HeadAge, a.HeadAge)
		}
		return cmp.Or(c, cmp.Compare(rank[a.Group], rank[b.Group]))
	}
}

// groupParts is the partitions that may hold group's dead letters: its
// Home, and while the cluster grows and the group moves, its old home
// too, where its dead letters keep it until they are redriven or purged.
func (cl *Cluster) groupParts(group string) []int {
	if cl.Moves(group) {
		return []int{cl.first(group), cl.Home(group)}
	}
	return []int{cl.Home(group)}
}

// Tenants merges the partitions' tenants: counts added up, the weight
// the highest a partition has (SetTenantWeight writes them alike), the
// share from the merged counts. Each partition shares among its own
// tenants (docs/design.md, "Shares across tenants").
func (cl *Cluster) Tenants(ctx context.Context) ([]pgtransport.TenantInfo, error) {
	if c := cl.one(); c != nil {
		return c.Tenants(ctx)
	}
	all, err := gather(cl.all(), func(i int) ([]pgtransport.TenantInfo, error) { return cl.parts[i].Tenants(ctx) })
	if err != nil {
		return nil, err
	}
	at := map[string]int{} // a tenant's place in out
	var out []pgtransport.TenantInfo
	for _, part := range all {
		for _, t := range part {
			j, ok := at[t.Tenant]
			if !ok {
				at[t.Tenant] = len(out)
				out = append(out, t)
				continue
			}
			m := &out[j]
			m.Weight = max(m.Weight, t.Weight)
			m.Groups += t.Groups
			m.Leased += t.Leased
			m.Ready += t.Ready
			m.Delivered += t.Delivered
		}
	}
	slices.SortFunc(out, func(a, b pgtransport.TenantInfo) int { return strings.Compare(a.Tenant, b.Tenant) })
	core.Shares(out)
	return out, nil
}
