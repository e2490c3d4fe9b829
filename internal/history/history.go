// Package history records what workers did to a queue and checks the
// record against the transport's guarantees: every published message acked
// exactly once, per-group first deliveries in publish order, redeliveries
// only of the current head, no two overlapping leases on one group that
// both settled something, and nothing left behind.
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
	Published, Acked, Deliveries, Redeliveries, Unknown int
}

// Check returns every violation in ops (nil when none), given the rows
// left in the tables afterwards (all zero once everything is drained), and
// what the history shows.
func Check(ops []Op, leftMessages, leftGroups int) ([]error, Stats) {
	var (
		errs   []error
		st     Stats
		pub    = map[int64]Op{}        // seq -> its publish
		acks   = map[int64][]Op{}      // seq -> successful acks
		claim  = map[string][]Op{}     // group -> successful claims
		lease  = map[string]Op{}       // token+group -> the claim that granted it
		held   = map[string][]Op{}     // token+group -> successful ack/nack/extend
		maybe  = map[int64]bool{}      // seqs of acks with unknown outcomes
		unsure = map[string]bool{}     // groups with a publish of unknown outcome
		leased = map[string][]string{} // group -> tokens with a successful settle
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
			lease[key(o)] = o
		}
	}
	for _, o := range ops {
		if o.Outcome != OK || (o.Kind != Ack && o.Kind != Nack && o.Kind != Extend) {
			continue
		}
		if o.Kind == Ack {
			acks[o.Seq] = append(acks[o.Seq], o)
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
	st.Published = len(pub)

	// Every published message acked exactly once.
	for seq, p := range pub {
		switch n := len(acks[seq]); {
		case n == 0 && leftMessages == 0 && !maybe[seq]: // an ack of unknown outcome may have been it
			errs = append(errs, fmt.Errorf("message %d of %s published, never acked, and gone", seq, p.Group))
		case n > 1:
			errs = append(errs, fmt.Errorf("message %d of %s acked %d times", seq, p.Group, n))
		}
	}
	for seq, as := range acks {
		st.Acked++
		if _, ok := pub[seq]; !ok && !unsure[as[0].Group] {
			errs = append(errs, fmt.Errorf("message %d of %s acked but never published", seq, as[0].Group))
		}
	}
	if leftMessages != 0 || leftGroups != 0 {
		errs = append(errs, fmt.Errorf("%d messages and %d group rows left after the drain", leftMessages, leftGroups))
	}

	// Per group: first deliveries in publish order, and a redelivery is of
	// the current head (nothing later delivered before it). Deliveries of
	// one group never overlap, so they are ordered by when the claim
	// returned. Publish order is real-time order: a message whose publish
	// returned before another's began must be delivered first. (Publishes
	// racing each other into one group have no order but the one their
	// commits make; the redelivery check assumes there are none, so the
	// fault test gives each group one publisher.)
	for group, cs := range claim {
		slices.SortFunc(cs, func(a, b Op) int { return a.End.Compare(b.End) })
		var top int64
		first := map[int64]int{} // seq -> index of its first delivery
		for i, c := range cs {
			st.Deliveries++
			switch _, seen := first[c.Seq]; {
			case seen && c.Seq != top:
				errs = append(errs, fmt.Errorf("group %s: message %d redelivered after %d was delivered", group, c.Seq, top))
			case seen:
				st.Redeliveries++
			default:
				first[c.Seq] = i
				top = c.Seq
			}
		}
		for a, ia := range first {
			for b, ib := range first {
				pa, oka := pub[a]
				pb, okb := pub[b]
				if oka && okb && pa.End.Before(pb.Start) && ib < ia {
					errs = append(errs, fmt.Errorf("group %s: message %d first delivered after %d, published after it", group, a, b))
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
