package core

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	stdsync "sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtransport/pgtransport"
)

// MaxPartitions bounds a cluster's partition count: seq & 1023 names a
// message's partition (schema.Partition).
const MaxPartitions = 1024

// Cluster is one queue spread over N partitions (issue 18), each a Core on
// a database that holds the queue numbered by its place
// (schema.Partition), as the PL/Proxy proxy (schema/sql/proxy.sql) sees
// them: a group lives on partition Hashtext(group) & (N-1), and a message
// on partition seq & (N-1) (the seqs of partition i are i modulo 1,024).
// Order, the one holder per group and the fencing stay inside one
// partition; the Cluster routes a call to the partition its group or lease
// names, rotates claims over the partitions from a turn that moves with
// every claim, splits batches, and merges reads. The calls that name a
// group or a lease are the front-ends' own, on Part(Locate(group)) or
// Part(Of(seq)); the rest are here.
//
// While the cluster grows from N/2 partitions to N (docs/protocol.md,
// "Growing the cluster"), a group whose home changed lives in its old
// home until it has nothing left there: Locate finds it, and a publish
// tries the old home first (Core.PublishHere), which hands back the
// messages of a group that has left.
type Cluster struct {
	parts []*Core
	from  int           // while growing: the count it grew from; 0 otherwise
	turn  atomic.Uint32 // the next claim's first partition

	mu      stdsync.Mutex
	closing bool              // set by Close: no more waits start
	waits   stdsync.WaitGroup // ClaimWait's waits on each partition
}

// NewCluster returns the cluster of parts (parts[i] partition i), after
// checking that their count is a power of two up to MaxPartitions, that
// each database is numbered by its place (an unnumbered database is
// allowed as the only partition), that its server hashes groups as
// Hashtext does, and that a grown cluster is given whole: every
// partition armed for len(parts) (schema's growth), or none. A
// misnumbered or unnumbered partition, or a grown cluster given in part,
// is ErrInvalidConfig: its groups would be looked for in another
// database.
func NewCluster(ctx context.Context, parts []*Core) (*Cluster, error) {
	n := len(parts)
	if n == 0 || n > MaxPartitions || n&(n-1) != 0 {
		return nil, fmt.Errorf("%w: %d partitions; a cluster has a power of two, 1 to %d", pgtransport.ErrInvalidConfig, n, MaxPartitions)
	}
	const probe = "pgtransport: is hashtext the same here?"
	var (
		from     = -1 // the count it grew from: -1 unread, 0 none
		anyArmed = false
	)
	for i, c := range parts {
		if c == nil {
			return nil, fmt.Errorf("%w: partition %d is nil", pgtransport.ErrInvalidConfig, i)
		}
		var (
			part, armed, grownFrom *int32
			hash                   int32
		)
		if err := c.db.QueryRow(ctx, c.q.partition, probe).Scan(&part, &armed, &grownFrom, &hash); err != nil {
			return nil, mapErr(fmt.Sprintf("partition %d", i), err)
		}
		if err := checkArmed(i, n, armed, grownFrom, &from, &anyArmed); err != nil {
			return nil, err
		}
		switch {
		case part == nil && n > 1:
			return nil, fmt.Errorf("%w: partition %d is not numbered (schema.Partition, or pgtransport migrate apply --partition %d)", pgtransport.ErrInvalidConfig, i, i)
		case part != nil && int(*part) != i:
			return nil, fmt.Errorf("%w: the database given as partition %d is numbered %d", pgtransport.ErrInvalidConfig, i, *part)
		case hash != Hashtext(probe):
			return nil, fmt.Errorf("%w: partition %d's server hashes groups differently (a big-endian server?): hashtext routing would disagree with a proxy's", pgtransport.ErrInvalidConfig, i)
		}
	}
	cl := &Cluster{parts: slices.Clone(parts), from: max(from, 0)}
	cl.turn.Store(rand.Uint32())
	return cl, nil
}

// checkArmed checks partition i's growth record (the count it was armed
// for, the count it grew from) against a cluster of n: armed for n or not
// at all, all alike; *from is the count every partition so far grew
// from, and *anyArmed whether any was armed.
func checkArmed(i, n int, armed, grownFrom *int32, from *int, anyArmed *bool) error {
	switch {
	case armed != nil && int(*armed) > n:
		return fmt.Errorf("%w: partition %d belongs to a cluster grown to %d partitions; open it with all of them (OpenCluster reads them from the proxy)", pgtransport.ErrInvalidConfig, i, *armed)
	case armed != nil && int(*armed) != n:
		return fmt.Errorf("%w: partition %d was armed for a cluster of %d partitions, not %d", pgtransport.ErrInvalidConfig, i, *armed, n)
	case i > 0 && armed != nil && !*anyArmed:
		return fmt.Errorf("%w: partition %d is armed for growth and partition 0 is not: the growth was not finished (the proxy's harel_px_grow arms them all)", pgtransport.ErrInvalidConfig, i)
	case i > 0 && armed == nil && *anyArmed:
		return fmt.Errorf("%w: partition 0 is armed for growth and partition %d is not: the growth was not finished (the proxy's harel_px_grow arms them all)", pgtransport.ErrInvalidConfig, i)
	}
	g := 0
	if grownFrom != nil {
		g = int(*grownFrom)
	}
	if *from >= 0 && g != *from {
		return fmt.Errorf("%w: partition %d grew from %d partitions, partition 0 from %d: the growth is half finished (the proxy's harel_px_grown)", pgtransport.ErrInvalidConfig, i, g, *from)
	}
	*from, *anyArmed = g, armed != nil
	return nil
}

// N is the number of partitions.
func (cl *Cluster) N() int { return len(cl.parts) }

// Part is partition i.
func (cl *Cluster) Part(i int) *Core { return cl.parts[i] }

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
	return cl.first(group) != cl.Home(group) && checkGroup(group) == nil
}

// Locate is the partition that holds group now: Home, but while the
// cluster grows and the group moves, its old home as long as it has
// anything there (a message, a lease, a dead letter, a kept state, a
// dedup key), which takes a round-trip to that partition. A group found
// in its new home stays there; one found in its old home may leave it as
// soon as its last message is acked. An invalid group id is
// ErrInvalidGroup, with nothing sent.
func (cl *Cluster) Locate(ctx context.Context, group string) (int, error) {
	if err := checkGroup(group); err != nil {
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
	if err := checkBatch(max); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	return cl.ClaimUpTo(ctx, workerID, visibility, minPriority, max)
}

// ClaimUpTo is ClaimMany with max unchecked (1 for Claim).
func (cl *Cluster) ClaimUpTo(ctx context.Context, workerID string, visibility time.Duration, minPriority, max int) ([]*pgtransport.Lease, error) {
	if err := CheckClaim(workerID, visibility, minPriority); err != nil {
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
	if err := CheckClaim(workerID, visibility, minPriority); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	var (
		first  error
		failed int
	)
	for _, i := range cl.rotation() {
		l, err := cl.parts[i].Claim(ctx, workerID, visibility, minPriority)
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
			c.giveBack(context.WithoutCancel(ctx), l) // another partition's lease won
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
			cl.parts[cl.Of(r.l)].giveBack(context.WithoutCancel(ctx), r.l)
			break
		}
	}
	return nil, fmt.Errorf("claim: %w", ctx.Err())
}

// Close stops ClaimWait from starting waits (it returns ErrClosed) and
// waits for the goroutines of those it left behind (waits that were
// ending as it returned) to end: once every partition's Core is closed, at
// most a claim's time out (30 s) and a give-back's (5 s) against a
// partition that does not answer, usually at once. The front-ends call it
// after closing the partitions.
func (cl *Cluster) Close() {
	cl.mu.Lock()
	cl.closing = true
	cl.mu.Unlock()
	cl.waits.Wait()
}

// each runs f for every partition in parts at once and waits for them.
func each(parts []int, f func(i int)) {
	if len(parts) == 1 {
		f(parts[0])
		return
	}
	var wg stdsync.WaitGroup
	for _, i := range parts {
		wg.Go(func() { f(i) })
	}
	wg.Wait()
}

// split groups the indexes of n items by partition: route(k) is item k's.
// It returns the partitions in ascending order and each one's items in
// input order.
func split(n int, route func(k int) int) (parts []int, items map[int][]int) {
	items = make(map[int][]int)
	for k := range n {
		i := route(k)
		if _, ok := items[i]; !ok {
			parts = append(parts, i)
		}
		items[i] = append(items[i], k)
	}
	slices.Sort(parts)
	return parts, items
}

// all is every partition.
func (cl *Cluster) all() []int { return allOf(len(cl.parts)) }

// allOf is 0 ... n-1.
func allOf(n int) []int {
	parts := make([]int, n)
	for i := range parts {
		parts[i] = i
	}
	return parts
}

// PublishMany publishes msgs, each on its group's partition, and returns
// their seqs in input order. Every message is checked first, so a batch
// with a bad message writes nothing. Each partition's share is one
// Core.PublishMany, in its own transaction, the partitions at once: a
// batch is atomic per partition, not across. An error names the
// partitions that failed (their messages are not published, or, with
// ErrOutcomeUnknown, may be), and the seqs returned with it are those of
// the other partitions' messages, which are published (0 for a failed
// partition's). Retry the messages whose seq is 0, or give every message
// a DedupKey and retry the batch.
func (cl *Cluster) PublishMany(ctx context.Context, msgs []pgtransport.Message) ([]int64, error) {
	if len(msgs) == 0 {
		return nil, fmt.Errorf("publish: %w: no messages", pgtransport.ErrInvalidBatch)
	}
	for k, m := range msgs {
		if err := cl.parts[0].checkMessage(m); err != nil {
			return nil, fmt.Errorf("publish: message %d: %w", k, err)
		}
	}
	seqs := make([]int64, len(msgs))
	errs := make([]error, len(cl.parts))
	all := make([]int, len(msgs))
	for k := range all {
		all[k] = k
	}
	// While growing, a moving group's messages go to its old home first,
	// which hands back those of a group that has left (seq 0); they go to
	// its home next. A failed partition's messages are not retried.
	called := make([]bool, len(cl.parts))
	cl.publishOn(ctx, msgs, all, cl.first, seqs, errs, called, cl.from != 0)
	if cl.from != 0 {
		var back []int
		for k, s := range seqs {
			if s == 0 && errs[cl.first(msgs[k].Group)] == nil {
				back = append(back, k)
			}
		}
		if len(back) > 0 {
			cl.publishOn(ctx, msgs, back, cl.Home, seqs, errs, called, false)
		}
	}
	spanned := count(called, true)
	for i, err := range errs {
		if err != nil {
			errs[i] = partitionErr(spanned, i, err)
		}
	}
	return seqs, errors.Join(errs...)
}

// publishOn publishes msgs[ks], each on partition route(its group), one
// Core call per partition at once (PublishHere where here), filling seqs,
// errs and the partitions called.
func (cl *Cluster) publishOn(ctx context.Context, msgs []pgtransport.Message, ks []int, route func(string) int,
	seqs []int64, errs []error, called []bool, here bool) {
	parts, items := split(len(ks), func(j int) int { return route(msgs[ks[j]].Group) })
	for _, i := range parts {
		called[i] = true
	}
	each(parts, func(i int) {
		batch := make([]pgtransport.Message, len(items[i]))
		for j, x := range items[i] {
			batch[j] = msgs[ks[x]]
		}
		publish := cl.parts[i].PublishMany
		if here && i < cl.from {
			publish = cl.parts[i].PublishHere
		}
		s, err := publish(ctx, batch)
		if err != nil {
			errs[i] = err
			return
		}
		for j, x := range items[i] {
			seqs[ks[x]] = s[j]
		}
	})
}

// partitionErr is err of partition i, named when the call spanned
// several.
func partitionErr(spanned, i int, err error) error {
	if spanned == 1 {
		return err
	}
	return fmt.Errorf("partition %d: %w", i, err)
}

// AckMany acks leases, each on its message's partition (one Core.AckMany
// per partition, at once), and returns an entry per lease in input order
// as Core.AckMany does. Every lease is checked first (a nil one refuses
// the batch, nothing acked). When a partition's call fails, each of its
// leases' entries holds that error as well as the call's error, which
// joins the failed partitions' errors; the other partitions' entries are
// their outcome.
func (cl *Cluster) AckMany(ctx context.Context, leases []*pgtransport.Lease) ([]error, error) {
	if err := checkBatch(len(leases)); err != nil {
		return nil, fmt.Errorf("ack: %w", err)
	}
	for _, l := range leases {
		if err := checkLease(l); err != nil {
			return nil, fmt.Errorf("ack: %w", err)
		}
	}
	parts, items := split(len(leases), func(k int) int { return cl.Of(leases[k]) })
	out := make([]error, len(leases))
	errs := make([]error, len(cl.parts))
	each(parts, func(i int) {
		batch := make([]*pgtransport.Lease, len(items[i]))
		for j, k := range items[i] {
			batch[j] = leases[k]
		}
		res, err := cl.parts[i].AckMany(ctx, batch)
		for j, k := range items[i] {
			if err != nil {
				out[k] = err
			} else {
				out[k] = res[j]
			}
		}
		if err != nil {
			errs[i] = partitionErr(len(parts), i, err)
		}
	})
	return out, errors.Join(errs...)
}

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
	if q.Group != "" {
		return cl.parts[cl.Home(q.Group)].DeadLetters(ctx, q)
	}
	pages, err := gather(cl.all(), func(i int) ([]pgtransport.DeadLetter, error) { return cl.parts[i].DeadLetters(ctx, q) })
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
	return cl.deadLetterCall(f, func(i int, f pgtransport.DeadLetterFilter) (int64, error) { return cl.parts[i].Redrive(ctx, f) })
}

// PurgeDeadLetters is Core.PurgeDeadLetters over the partitions, as Redrive.
func (cl *Cluster) PurgeDeadLetters(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error) {
	return cl.deadLetterCall(f, func(i int, f pgtransport.DeadLetterFilter) (int64, error) {
		return cl.parts[i].PurgeDeadLetters(ctx, f)
	})
}

func (cl *Cluster) deadLetterCall(f pgtransport.DeadLetterFilter, call func(int, pgtransport.DeadLetterFilter) (int64, error)) (int64, error) {
	switch {
	case f.Group != "":
		return call(cl.Home(f.Group), f)
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
	if err := checkGroupQuery(q); err != nil {
		return nil, fmt.Errorf("groups: %w", err)
	}
	limit := cmp.Or(q.Limit, pgtransport.DefaultGroupLimit)
	want := q.Offset + limit
	lists, err := gather(cl.all(), func(i int) ([]pgtransport.GroupInfo, error) {
		var out []pgtransport.GroupInfo
		for len(out) < want {
			page := pgtransport.GroupQuery{State: q.State, Order: q.Order, Offset: len(out), Limit: min(want-len(out), pgtransport.MaxBatch)}
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
	var sorted []string
	ids := make([]string, len(out))
	for k, g := range out {
		ids[k] = g.Group
	}
	if err := cl.parts[0].db.QueryRow(ctx, `SELECT COALESCE(array_agg(g ORDER BY g), '{}') FROM unnest($1::text[]) AS u(g)`, ids).Scan(&sorted); err != nil {
		return nil, mapErr("groups", err)
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

// Begin begins a transaction on partition i (a TxHandler's, say).
func (cl *Cluster) Begin(ctx context.Context, i int) (pgx.Tx, error) { return cl.parts[i].Begin(ctx) }

// Shares splits conc worker slots over the partitions: each its equal
// share, the first ones one more while any is left, and at least one each
// (a partition with no slot would never be served), so the total is the
// larger of conc and N. Per-message cost holds steady when each partition
// is served by its own share of the slots (bench suite proxy).
func (cl *Cluster) Shares(conc int) []int {
	n := len(cl.parts)
	shares := make([]int, n)
	for i := range shares {
		shares[i] = max(conc/n+btoi(i < conc%n), 1)
	}
	return shares
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// RunEach runs run(ctx, i, cfg with Concurrency its Shares) for every
// partition at once (a worker runtime each), until all have returned. The
// first error cancels the others' ctx and is returned (with any others
// they then return).
func (cl *Cluster) RunEach(ctx context.Context, cfg pgtransport.WorkerConfig, run func(ctx context.Context, i int, cfg pgtransport.WorkerConfig) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	shares := cl.Shares(cfg.Concurrency)
	errs := make([]error, len(cl.parts))
	each(cl.all(), func(i int) {
		cfg := cfg
		cfg.Concurrency = shares[i]
		if errs[i] = run(ctx, i, cfg); errs[i] != nil {
			errs[i] = partitionErr(len(cl.parts), i, errs[i])
			cancel()
		}
	})
	return errors.Join(errs...)
}

// CheckTx is what a call in the caller's transaction tx on partition i
// checks before it sends anything: first its own arguments (pre, the
// error of their check, so bad input is refused as on one database), then
// the transaction. It refuses (ErrInvalidConfig) one that is not on
// partition i's database: a message published there would be out of its
// group's order, a lease acked there not found.
func (cl *Cluster) CheckTx(ctx context.Context, tx pgx.Tx, i int, pre error) error {
	if pre != nil {
		return pre
	}
	if tx == nil || len(cl.parts) == 1 {
		return nil // one partition: any database is it; nil: the call refuses it
	}
	p, err := cl.txPart(ctx, tx)
	if err != nil {
		return err
	}
	if p != i {
		return notOn(i)
	}
	return nil
}

// CheckPublishTx is CheckTx for a publish of group in tx, and returns the
// partition to publish on. A moving group's old home takes the
// transaction as it is: its fence refuses the message (ErrGroupMoved) if
// the group has left. Its new home takes it once the old one's fence says
// the group has left (Core.Left: a decision that holds, where Locate's
// look does not).
func (cl *Cluster) CheckPublishTx(ctx context.Context, tx pgx.Tx, group string, pre error) (int, error) {
	if pre != nil || !cl.Moves(group) || tx == nil {
		i := cl.Home(group)
		return i, cl.CheckTx(ctx, tx, i, pre)
	}
	p, err := cl.txPart(ctx, tx)
	if err != nil {
		return 0, err
	}
	old := cl.first(group)
	if p == old {
		return p, nil
	}
	left, err := cl.parts[old].Left(ctx, []string{group})
	if err != nil {
		return 0, fmt.Errorf("partition %d: %w", old, err)
	}
	if len(left) == 0 {
		return 0, notOn(old)
	}
	if home := cl.Home(group); p != home {
		return 0, notOn(home)
	}
	return p, nil
}

// notOn is the refusal of a transaction that is not on partition i.
func notOn(i int) error {
	return fmt.Errorf("%w: the transaction is not on the database of partition %d, where the group lives (Cluster.Locate)", pgtransport.ErrInvalidConfig, i)
}

// txPart is the partition number of tx's database, -1 for one that is not
// a partition. It looks first whether the database holds a queue at all
// (so a transaction elsewhere, on the proxy or the application's own
// database, is refused without an error that would abort it), then at
// the partition's number: two round-trips in tx.
func (cl *Cluster) txPart(ctx context.Context, tx pgx.Tx) (int, error) {
	c := cl.parts[0]
	var (
		isPart                 bool
		part, armed, grownFrom *int32
		hash                   int32
	)
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, c.q.partitionTable).Scan(&isPart); err != nil {
		return 0, mapErr("check the transaction's database", err)
	}
	if isPart {
		if err := tx.QueryRow(ctx, c.q.partition, "").Scan(&part, &armed, &grownFrom, &hash); err != nil {
			return 0, mapErr("check the transaction's database", err)
		}
	}
	if part == nil {
		return -1, nil
	}
	return int(*part), nil
}
