// Package history records what workers did to a queue and checks the
// record against the transport's guarantees: every published message acked
// exactly once or dead-lettered exactly once (again after each redrive),
// per-group first deliveries in publish order, redeliveries only of the
// current head, a redriven message back at the head of its group, no two
// overlapping leases on one group that both settled something, and nothing
// left behind.
package history

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	stdsync "sync"
	"time"
)

// Kind is what an operation did.
type Kind string

// The operations a history records.
const (
	Publish Kind = "publish"
	Claim   Kind = "claim"
	Ack     Kind = "ack"
	Nack    Kind = "nack"
	Extend  Kind = "extend"
	// Fail settles like Nack: the head parked for a backoff, or moved
	// to the dead letters on its last attempt.
	Fail Kind = "fail"
	// Dead: the caller learned the message was moved to the dead letters
	// (a Fail of its last attempt). Seq names it; nothing else is needed.
	Dead Kind = "dead"
	// Redrive: the message was put back from the dead letters (one op per
	// seq; the operator redrives only what it saw there).
	Redrive Kind = "redrive"
)

// Outcome is what the caller learned.
type Outcome int

const (
	// OK: the call succeeded.
	OK Outcome = iota
	// Failed: the call definitely changed nothing (ErrLeaseLost, bad input).
	Failed
	// Unknown: the call may or may not have taken effect (a connection
	// killed, a statement timeout or a cancelled context mid-flight).
	Unknown
)

// Op is one call, with the wall-clock interval it ran in.
type Op struct {
	Kind    Kind
	Worker  string
	Group   string
	Seq     int64
	Token   string
	Outcome Outcome
	Start   time.Time
	End     time.Time
}

// History collects ops from many goroutines.
type History struct {
	mu  stdsync.Mutex
	ops []Op
}

// Add records op.
func (h *History) Add(op Op) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// Ops returns a copy of the record.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ops)
}

// Stats summarises a history.
type Stats struct {
	Published, Acked, DeadLettered, Redriven, Deliveries, Redeliveries, Unknown int
}

// End is what the tables hold once the run is over and drained.
type End struct {
	// Messages and Groups: rows left in transport_messages and
	// transport_groups (both 0 after a full drain).
	Messages, Groups int
	// Dead: the seqs in transport_dead_letters.
	Dead []int64
}

// life names one lifetime of a message: n is how many redrives came before
// it (0 from its publish to its first dead-lettering).
type life struct {
	seq int64
	n   int
}

// Check returns every violation in ops (nil when none), given what the
// tables hold afterwards, and what the history shows.
//
// A message lives from its publish (or a redrive) until it is acked or
// dead-lettered; each lifetime ends exactly one of those ways, once. A
// Redrive op says the message was in the dead letters and was put back:
// the lifetime before it ended dead-lettered (whether or not a Dead op saw
// it: a claim that finds a head's attempts used up moves it without
// anyone learning), and the next begins. The last lifetime ends as the
// tables say: dead-lettered if its seq is in End.Dead, else acked. A
// Redrive of unknown outcome took effect if and only if the message was
// claimed after the redrive began (a drained queue leaves no redriven
// message undelivered).
//
// Times: an op of a lifetime starts after the redrive that began it
// started, and a Dead op's Fail started before the redrive that ends its
// lifetime (the operator redrives what it listed). A Claim's Start must be
// no later than when the claim was sent (an async stream's claim is sent
// before its lease is received: record a bound such as the stream's start).
func Check(ops []Op, end End) ([]error, Stats) {
	var (
		errs    []error
		st      Stats
		pub     = map[int64]Op{}        // seq -> its publish
		acks    = map[life][]Op{}       // lifetime -> successful acks
		deaths  = map[life][]Op{}       // lifetime -> Dead ops
		claim   = map[string][]Op{}     // group -> successful claims
		byseq   = map[int64][]Op{}      // seq -> successful claims
		lease   = map[string]Op{}       // token+group -> the claim that granted it
		held    = map[string][]Op{}     // token+group -> successful ack/nack/fail/extend
		maybe   = map[int64]bool{}      // seqs of acks with unknown outcomes
		unsure  = map[string]bool{}     // groups with a publish of unknown outcome
		leased  = map[string][]string{} // group -> tokens with a successful settle
		tried   = map[int64][]Op{}      // seq -> redrives (OK or unknown)
		redrive = map[int64][]Op{}      // seq -> redrives that took effect, by start
		dead    = map[int64]bool{}      // seqs in the dead letters at the end
	)
	key := func(o Op) string { return o.Token + "\x00" + o.Group }
	for _, o := range ops {
		if o.Outcome == Unknown {
			st.Unknown++
		}
		switch {
		case o.Kind == Publish && o.Outcome == OK:
			pub[o.Seq] = o
		case o.Kind == Publish && o.Outcome == Unknown:
			unsure[o.Group] = true // its seq is unknown: it may exist
		case o.Kind == Ack && o.Outcome == Unknown:
			maybe[o.Seq] = true
		case o.Kind == Claim && o.Outcome == OK:
			claim[o.Group] = append(claim[o.Group], o)
			byseq[o.Seq] = append(byseq[o.Seq], o)
			lease[key(o)] = o
		case o.Kind == Redrive && o.Outcome != Failed:
			tried[o.Seq] = append(tried[o.Seq], o)
		}
	}
	for seq, rs := range tried {
		for _, r := range rs {
			took := r.Outcome == OK || slices.ContainsFunc(byseq[seq], func(c Op) bool { return c.End.After(r.Start) })
			if took {
				redrive[seq] = append(redrive[seq], r)
				st.Redriven++
			}
		}
		slices.SortFunc(redrive[seq], func(a, b Op) int { return a.Start.Compare(b.Start) })
	}
	// lifeAt: the lifetime of seq an op at t belongs to.
	lifeAt := func(seq int64, t time.Time) life {
		n := 0
		for _, r := range redrive[seq] {
			if r.Start.Before(t) {
				n++
			}
		}
		return life{seq, n}
	}
	for _, o := range ops {
		if o.Kind == Dead && o.Outcome == OK {
			k := lifeAt(o.Seq, o.Start)
			deaths[k] = append(deaths[k], o)
		}
		if o.Outcome != OK || (o.Kind != Ack && o.Kind != Nack && o.Kind != Fail && o.Kind != Extend) {
			continue
		}
		if o.Kind == Ack {
			k := lifeAt(o.Seq, o.Start)
			acks[k] = append(acks[k], o)
		}
		if _, ok := lease[key(o)]; !ok {
			errs = append(errs, fmt.Errorf("%s by %s on %s succeeded with a token never granted (%s)", o.Kind, o.Worker, o.Group, o.Token))
			continue
		}
		if len(held[key(o)]) == 0 {
			leased[o.Group] = append(leased[o.Group], o.Token)
		}
		held[key(o)] = append(held[key(o)], o)
	}
	for _, seq := range end.Dead {
		dead[seq] = true
	}
	st.Published = len(pub)

	// Every lifetime of a published message ends acked exactly once or
	// dead-lettered exactly once.
	for seq, p := range pub {
		last := len(redrive[seq])
		for n := 0; n <= last; n++ {
			k := life{seq, n}
			a, d := len(acks[k]), len(deaths[k])
			died := d > 0 || n < last || dead[seq] // a redrive takes a dead letter
			if n == last && d > 0 && !dead[seq] {
				errs = append(errs, fmt.Errorf("message %d of %s dead-lettered but not in the dead letters at the end", seq, p.Group))
			}
			if died {
				st.DeadLettered++
			}
			if a > 0 {
				st.Acked++
			}
			switch {
			case a > 0 && died:
				errs = append(errs, fmt.Errorf("message %d of %s both acked and dead-lettered (lifetime %d)", seq, p.Group, n))
			case a > 1:
				errs = append(errs, fmt.Errorf("message %d of %s acked %d times", seq, p.Group, a))
			case d > 1:
				errs = append(errs, fmt.Errorf("message %d of %s dead-lettered %d times", seq, p.Group, d))
			case a == 0 && !died && n == last && end.Messages == 0 && !maybe[seq]: // an ack of unknown outcome may have been it
				errs = append(errs, fmt.Errorf("message %d of %s published, never acked nor dead-lettered, and gone", seq, p.Group))
			}
		}
	}
	for k, as := range acks {
		if _, ok := pub[k.seq]; !ok && !unsure[as[0].Group] {
			errs = append(errs, fmt.Errorf("message %d of %s acked but never published", k.seq, as[0].Group))
		}
	}
	for k, ds := range deaths {
		if _, ok := pub[k.seq]; !ok && !unsure[ds[0].Group] {
			errs = append(errs, fmt.Errorf("message %d of %s dead-lettered but never published", k.seq, ds[0].Group))
		}
	}
	for _, seq := range end.Dead {
		if _, ok := pub[seq]; !ok && len(unsure) == 0 {
			errs = append(errs, fmt.Errorf("message %d in the dead letters but never published", seq))
		}
	}
	if end.Messages != 0 || end.Groups != 0 {
		errs = append(errs, fmt.Errorf("%d messages and %d group rows left after the drain", end.Messages, end.Groups))
	}

	// Per group: first deliveries in publish order, and a redelivery is of
	// the current head: nothing later in seq order was first delivered
	// since its own first delivery. Deliveries of one group never overlap,
	// so they are ordered by when the claim returned. Publish order is
	// real-time order: a message whose publish returned before another's
	// began must be delivered first. (Publishes racing each other into one
	// group have no order but the one their commits make; the redelivery
	// check assumes there are none, so the fault test gives each group one
	// publisher.) A dead-lettered message leaves the order; a redriven one
	// re-enters it at the head (its seq is older than anything left), so
	// its next first delivery comes before that of any message published
	// before the redrive began and not claimed before it ended.
	for group, cs := range claim {
		slices.SortFunc(cs, func(a, b Op) int { return a.End.Compare(b.End) })
		var order []life        // first deliveries, in order
		first := map[life]int{} // lifetime -> its index in order
		sent := map[life]Op{}   // lifetime -> the claim of its first delivery
		for _, c := range cs {
			st.Deliveries++
			k := lifeAt(c.Seq, c.End)
			at, seen := first[k]
			if !seen {
				first[k] = len(order)
				sent[k] = c
				order = append(order, k)
				continue
			}
			st.Redeliveries++
			for _, o := range order[at+1:] {
				if o.seq > c.Seq {
					errs = append(errs, fmt.Errorf("group %s: message %d redelivered after %d was delivered", group, c.Seq, o.seq))
					break
				}
			}
		}
		for a, ia := range first {
			for b, ib := range first {
				pa, oka := pub[a.seq]
				pb, okb := pub[b.seq]
				if a.n == 0 && b.n == 0 && oka && okb && pa.End.Before(pb.Start) && ib < ia {
					errs = append(errs, fmt.Errorf("group %s: message %d first delivered after %d, published after it", group, a.seq, b.seq))
				}
			}
		}
		for k, ik := range first {
			if k.n == 0 {
				continue
			}
			r := redrive[k.seq][k.n-1]
			for m, im := range first {
				pm, ok := pub[m.seq]
				if m.n == 0 && ok && pm.End.Before(r.Start) && sent[m].Start.After(r.End) && im < ik {
					errs = append(errs, fmt.Errorf("group %s: message %d delivered before %d, redriven ahead of it", group, m.seq, k.seq))
				}
			}
		}
	}

	// Fencing: two leases on one group that both settled something never
	// overlapped. A lease surely held from its claim's return to the start
	// of its last successful settle; two such spans must not intersect.
	for group, tokens := range leased {
		type span struct {
			from, to time.Time
			token    string
		}
		var spans []span
		for _, tok := range tokens {
			k := tok + "\x00" + group
			c, ok := lease[k]
			if !ok {
				continue
			}
			last := slices.MaxFunc(held[k], func(a, b Op) int { return a.Start.Compare(b.Start) })
			spans = append(spans, span{c.End, last.Start, tok})
		}
		slices.SortFunc(spans, func(a, b span) int { return a.from.Compare(b.from) })
		for i := 1; i < len(spans); i++ {
			if spans[i].from.Before(spans[i-1].to) {
				errs = append(errs, fmt.Errorf("group %s: leases %s and %s both settled and overlapped", group, spans[i-1].token, spans[i].token))
			}
		}
	}
	slices.SortFunc(errs, func(a, b error) int { return cmp.Compare(a.Error(), b.Error()) })
	return errs, st
}

// Join is errors.Join, for a test's failure message.
func Join(errs []error) error { return errors.Join(errs...) }
