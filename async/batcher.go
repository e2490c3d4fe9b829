package async

import "github.com/pgtransport/pgtransport"

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
}

// add queues an ack of l and returns the channel its answer comes on.
func (b *ackBatcher) add(l *pgtransport.Lease) <-chan error {
	done := make(chan error, 1)
	b.queue = append(b.queue, ackRequest{lease: l, done: done})
	return done
}

// len is how many acks wait for the next round-trip.
func (b *ackBatcher) len() int { return len(b.queue) }

// take hands out every ack waiting, oldest first.
func (b *ackBatcher) take() []ackRequest {
	acks := b.queue
	b.queue = nil
	return acks
}

// requeue puts acks of a failed round-trip back, ahead of any that came
// since, for the next one.
func (b *ackBatcher) requeue(acks []ackRequest) { b.queue = append(acks, b.queue...) }

// close stops taking acks and hands out those still waiting.
func (b *ackBatcher) close() []ackRequest {
	b.closed = true
	return b.take()
}

// answer delivers err to every ack of acks.
func answer(acks []ackRequest, err error) {
	for _, a := range acks {
		a.done <- err
	}
}

func leasesOf(acks []ackRequest) []*pgtransport.Lease {
	ls := make([]*pgtransport.Lease, len(acks))
	for i, a := range acks {
		ls[i] = a.lease
	}
	return ls
}
