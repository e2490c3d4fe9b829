package history

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
)

// The effect view: what transactional handlers (WorkTx,
// AckStateTx) leave in the user's own tables. Each handler writes one
// effect row per message inside the transaction that acks it, and folds
// the message into its group's state; the queue promises that every
// message's effect is applied exactly once, in publish order per group,
// and the state is the fold of the group's messages in that order.

// Message is a published message as the effect view sees it: its group,
// seq and event.
type Message struct {
	Group string
	Seq   int64
	Event string
}

// Effect is one effect row: ID is its place in commit order within a
// group (a sequence the handler draws inside its transaction: a later
// message of a group is handled, so draws, only after the earlier one's
// transaction committed).
type Effect struct {
	ID    int64
	Group string
	Seq   int64
}

// EffectView is what a run left: the messages published (every one
// published for sure), the effect rows, each group's final state, and
// the fold that makes a state from the previous one and a message's event.
type EffectView struct {
	Published []Message
	Effects   []Effect
	States    map[string][]byte
	Fold      func(state []byte, event string) []byte
}

// EffectStats are a checked view's figures.
type EffectStats struct {
	Messages, Groups, Effects int
}

// CheckEffects checks the effect view: every published message has
// exactly one effect row (none missing, none twice, none for a message
// never published); per group, the rows in ID order are in publish (seq)
// order; and each group's state is the fold of its events in publish order.
func CheckEffects(v EffectView) ([]error, EffectStats) {
	var errs []error
	byGroup := map[string][]Message{}
	published := map[int64]Message{}
	for _, m := range v.Published {
		byGroup[m.Group] = append(byGroup[m.Group], m)
		published[m.Seq] = m
	}
	seen := map[int64]int{}
	effects := map[string][]Effect{}
	for _, e := range v.Effects {
		seen[e.Seq]++
		m, ok := published[e.Seq]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("effect %d of %s/%d: no such message was published", e.ID, e.Group, e.Seq))
			continue
		case m.Group != e.Group:
			errs = append(errs, fmt.Errorf("effect %d of %s/%d: message %d is %s's", e.ID, e.Group, e.Seq, e.Seq, m.Group))
			continue
		}
		if seen[e.Seq] == 2 {
			errs = append(errs, fmt.Errorf("message %s/%d: applied more than once", e.Group, e.Seq))
		}
		effects[e.Group] = append(effects[e.Group], e)
	}
	for _, m := range v.Published {
		if seen[m.Seq] == 0 {
			errs = append(errs, fmt.Errorf("message %s/%d: never applied", m.Group, m.Seq))
		}
	}
	groups := slices.Sorted(func(yield func(string) bool) {
		for g := range byGroup {
			if !yield(g) {
				return
			}
		}
	})
	for _, g := range groups {
		msgs := byGroup[g]
		slices.SortFunc(msgs, func(a, b Message) int { return cmp.Compare(a.Seq, b.Seq) })
		rows := effects[g]
		slices.SortFunc(rows, func(a, b Effect) int { return cmp.Compare(a.ID, b.ID) })
		for i := 1; i < len(rows); i++ {
			if rows[i].Seq < rows[i-1].Seq {
				errs = append(errs, fmt.Errorf("group %s: message %d applied after %d (effects %d, %d): out of publish order",
					g, rows[i].Seq, rows[i-1].Seq, rows[i-1].ID, rows[i].ID))
			}
		}
		var want []byte
		for _, m := range msgs {
			want = v.Fold(want, m.Event)
		}
		if got := v.States[g]; !bytes.Equal(got, want) {
			errs = append(errs, fmt.Errorf("group %s: state %q, want %q (the fold of its %d events in order)", g, got, want, len(msgs)))
		}
	}
	return errs, EffectStats{Messages: len(v.Published), Groups: len(groups), Effects: len(v.Effects)}
}
