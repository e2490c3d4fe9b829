package async

import (
	"strings"
	stdsync "sync"
	"sync/atomic"
	"time"

	"github.com/pgtransport/pgtransport"
)

// streamSet is a Transport's running streams. A call given a lease (Ack,
// Nack, Extend, AckNext, AckMany) asks them which one holds it, and that
// stream settles it or books the change in its own ledger: the stream's
// ledger is the only record of what it holds.
//
// Why a lookup and not a handle in the Lease: pgtransport.Lease is a plain
// value shared with the blocking transport, which callers may copy, log,
// serialise and rebuild from its fields (Group, Seq, Token are all the
// database fences on). A hidden pointer would route a rebuilt lease past
// its stream, whose slot would then stay taken until the visibility ran
// out. Asking the streams routes any lease value the database would accept.
// A Transport has few streams, each asked only if the lease's token is its
// worker's, with one lock of its own.
type streamSet struct {
	mu   stdsync.Mutex             // serialises add and remove
	list atomic.Pointer[[]*stream] // copied on write: lookups take no lock
}

func (ss *streamSet) add(s *stream) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var list []*stream
	if old := ss.list.Load(); old != nil {
		list = append(list, *old...)
	}
	list = append(list, s)
	ss.list.Store(&list)
}

func (ss *streamSet) remove(s *stream) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	old := ss.list.Load()
	if old == nil {
		return
	}
	list := make([]*stream, 0, len(*old))
	for _, o := range *old {
		if o != s {
			list = append(list, o)
		}
	}
	ss.list.Store(&list)
}

// find returns the first stream that may hold l for which f is true.
func (ss *streamSet) find(l *pgtransport.Lease, f func(*stream) bool) bool {
	list := ss.list.Load()
	if list == nil || l == nil {
		return false
	}
	for _, s := range *list {
		if s.mayHold(l) && f(s) {
			return true
		}
	}
	return false
}

// enqueue hands an ack of l to the stream that holds l; false if none
// takes it (the caller acks on its own).
func (ss *streamSet) enqueue(l *pgtransport.Lease) (done <-chan error, ok bool) {
	ss.find(l, func(s *stream) bool {
		done, ok = s.enqueue(l)
		return ok
	})
	return done, ok
}

// release frees the slot of l, settled outside its stream's round-trips.
func (ss *streamSet) release(l *pgtransport.Lease) {
	ss.find(l, func(s *stream) bool { return s.release(l) })
}

// extend records that l now holds until until and, after an AckNext that
// kept the group, that next is the message it holds.
func (ss *streamSet) extend(l, next *pgtransport.Lease, until time.Time) {
	ss.find(l, func(s *stream) bool { return s.extend(l, next, until) })
}

// mayHold reports whether l's token is one of this stream's worker's
// (core.NewToken prefixes the worker ID): a cheap filter before the lock.
func (s *stream) mayHold(l *pgtransport.Lease) bool {
	w := s.cfg.WorkerID
	return strings.HasPrefix(l.Token, w) && len(l.Token) > len(w) && l.Token[len(w)] == ':'

}
