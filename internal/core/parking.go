package core

import stdsync "sync"

// Parking holds callers waiting for work in this process, oldest first, so
// that one freed group wakes one waiter rather than all of them (no herd).
// Take a Ticket before the claim that may find nothing, so a wake-up that
// lands between that claim and the wait is not lost.
type Parking struct {
	mu     stdsync.Mutex
	queue  []*Ticket
	closed bool
}

// Ticket is one caller's place in the queue.
type Ticket struct {
	c chan struct{}
	p *Parking
}

// Ticket queues the caller. After Close it is woken at once.
func (p *Parking) Ticket() *Ticket {
	t := &Ticket{c: make(chan struct{}, 1), p: p}
	p.mu.Lock()
	if p.closed {
		t.c <- struct{}{}
	} else {
		p.queue = append(p.queue, t)
	}
	p.mu.Unlock()
	return t
}

// Close wakes every waiter, and every later Ticket at once; Closed then
// reports true, so a waiter that wakes stops instead of waiting again.
// The Transport that owns p calls it as it closes. Safe to call twice.
func (p *Parking) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Wake(-1)
}

// Closed reports whether Close was called.
func (p *Parking) Closed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// C receives once the ticket is woken.
func (t *Ticket) C() <-chan struct{} { return t.c }

// Done leaves the queue (a no-op if the ticket was woken).
func (t *Ticket) Done() {
	t.p.mu.Lock()
	defer t.p.mu.Unlock()
	for i, q := range t.p.queue {
		if q == t {
			t.p.queue = append(t.p.queue[:i], t.p.queue[i+1:]...)
			return
		}
	}
}

// Wake wakes up to n waiters, oldest first; n < 0 wakes all.
func (p *Parking) Wake(n int) { p.WakeOthers(n, nil) }

// WakeOthers is Wake passing over own, the caller's own ticket (nil: none):
// work the caller freed itself is for the others.
func (p *Parking) WakeOthers(n int, own *Ticket) {
	p.mu.Lock()
	defer p.mu.Unlock()
	left := p.queue[:0]
	for _, t := range p.queue {
		if t == own || n == 0 {
			left = append(left, t)
			continue
		}
		t.c <- struct{}{} // buffered 1, and each ticket is woken once
		n--
	}
	clear(p.queue[len(left):])
	p.queue = left
}
