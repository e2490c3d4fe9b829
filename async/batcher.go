package async

import (
	"errors"
	"fmt"

	"github.com/pgtransport/pgtransport"
)

// ackBatcher collects the acks a stream's receivers send between its
// round-trips. Receivers add acks from any goroutine; the stream's loop
// takes them all for its next round-trip, which settles them in one
// transaction; each caller is answered once, on its own buffered channel,
// when that round-trip commits (or fails for good). River's jobcompleter
// is the model.
//
// It holds no lock: the stream's mutex guards it together with the
// stream's ledger, since admitting an ack (the ledger) and queueing it
// must be one step.
type ackBatcher struct {
	queue  []ackRequest
	closed bool // the stream is stopping: it takes no more acks
}

type ackRequest struct {
	lease *pgtransport.Lease
	done  chan error // buffered 1: answered once, never blocks
	// alone: a batch it was in was refused for good, so it is settled in
	// a round-trip of its own (and no claim), where a refusal is its own.
	alone bool
	// doubt: a round-trip it was in lost its reply, so it may have
	// applied; a retry that finds the lease gone must find out (resolve).
	doubt bool
}

// add queues an ack of l and returns the channel its answer comes on.
func (b *ackBatcher) add(l *pgtransport.Lease) <-chan error {
	done := make(chan error, 1)
	b.queue = append(b.queue, ackRequest{lease: l, done: done})
	return done
}

// len is how many acks wait for the next round-trip.
func (b *ackBatcher) len() int { return len(b.queue) }

// take hands out the acks for the next round-trip, oldest first: the
// oldest alone if it is to be settled alone (then alone is true), else
// every ack waiting but those.
func (b *ackBatcher) take() (acks []ackRequest, alone bool) {
	if len(b.queue) > 0 && b.queue[0].alone {
		acks = []ackRequest{b.queue[0]}
		b.queue = append([]ackRequest(nil), b.queue[1:]...)
		return acks, true
	}
	split := false
	for _, a := range b.queue {
		split = split || a.alone
	}
	if !split { // the usual case: all of them, as they are
		acks, b.queue = b.queue, nil
		return acks, false
	}
	var rest []ackRequest
	for _, a := range b.queue {
		if a.alone {
			rest = append(rest, a)
		} else {
			acks = append(acks, a)
		}
	}
	b.queue = rest
	return acks, false
}

// requeue puts acks of a failed round-trip back, ahead of any that came
// since, for the next one.
func (b *ackBatcher) requeue(acks []ackRequest) {
	b.queue = append(append([]ackRequest(nil), acks...), b.queue...)
}

// drain hands out every ack waiting.
func (b *ackBatcher) drain() []ackRequest {
	acks := b.queue
	b.queue = nil
	return acks
}

// close stops taking acks and hands out those still waiting.
func (b *ackBatcher) close() []ackRequest {
	b.closed = true
	return b.drain()
}

// answer delivers err to every ack of acks.
// answer gives each ack err, and says so where an earlier attempt lost its
// reply: that attempt may have applied, whatever this one met.
func answer(acks []ackRequest, err error) {
	for _, a := range acks {
		a.done <- doubted(a, err)
	}
}

// doubted is err for an ack, wrapped in ErrOutcomeUnknown if the ack is in
// doubt and err does not say so already.
func doubted(a ackRequest, err error) error {
	if err == nil || !a.doubt || errors.Is(err, pgtransport.ErrOutcomeUnknown) {
		return err
	}
	return fmt.Errorf("%w: an earlier attempt lost its reply: %w", pgtransport.ErrOutcomeUnknown, err)
}

func leasesOf(acks []ackRequest) []*pgtransport.Lease {
	ls := make([]*pgtransport.Lease, len(acks))
	for i, a := range acks {
		ls[i] = a.lease
	}
	return ls
}
