package pgtest

import (
	"context"
	"log/slog"
	"strings"
	stdsync "sync"
	"time"

	"github.com/pgtransport/pgtransport"
)

// Logs is a slog.Handler that records every record at or above Level, for
// tests that check what the library logs. Safe for concurrent use.
type Logs struct {
	Level slog.Level // the lowest level recorded; 0 is Info

	mu      stdsync.Mutex
	records []slog.Record
	attrs   []slog.Attr // from WithAttrs: those of a derived handler (shared slice, copied)
	parent  *Logs       // a derived handler records into its root
}

// Logger returns a logger that records into l.
func (l *Logs) Logger() *slog.Logger { return slog.New(l) }

func (l *Logs) root() *Logs {
	if l.parent != nil {
		return l.parent
	}
	return l
}

func (l *Logs) Enabled(_ context.Context, level slog.Level) bool { return level >= l.root().Level }

func (l *Logs) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(l.attrs...)
	root := l.root()
	root.mu.Lock()
	defer root.mu.Unlock()
	root.records = append(root.records, r)
	return nil
}

func (l *Logs) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &Logs{parent: l.root(), attrs: append(append([]slog.Attr(nil), l.attrs...), attrs...)}
}

func (l *Logs) WithGroup(string) slog.Handler { return l } // the tests use no groups

// Records returns a copy of the records so far.
func (l *Logs) Records() []slog.Record {
	root := l.root()
	root.mu.Lock()
	defer root.mu.Unlock()
	return append([]slog.Record(nil), root.records...)
}

// Find returns the records whose message holds substr, at level.
func (l *Logs) Find(level slog.Level, substr string) []slog.Record {
	var found []slog.Record
	for _, r := range l.Records() {
		if r.Level == level && strings.Contains(r.Message, substr) {
			found = append(found, r)
		}
	}
	return found
}

// Attr returns the value of r's attribute key, and whether it has one.
func Attr(r slog.Record, key string) (slog.Value, bool) {
	var (
		v  slog.Value
		ok bool
	)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v, ok = a.Value, true
			return false
		}
		return true
	})
	return v, ok
}

// Observer is a pgtransport.Observer that records every call, for tests.
// Safe for concurrent use.
type Observer struct {
	mu    stdsync.Mutex
	calls []ObservedCall
}

// ObservedCall is one call an Observer recorded.
type ObservedCall struct {
	Method  string // "Published", "Claimed", "Acked", "Failed", "LeaseLost" or "Handled"
	N       int    // Published, Claimed, Acked
	Lease   *pgtransport.Lease
	Outcome string // Failed
	D       time.Duration
	Err     error
}

func (o *Observer) add(c ObservedCall) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls = append(o.calls, c)
}

func (o *Observer) Published(n int, d time.Duration, err error) {
	o.add(ObservedCall{Method: "Published", N: n, D: d, Err: err})
}

func (o *Observer) Claimed(n int, d time.Duration, err error) {
	o.add(ObservedCall{Method: "Claimed", N: n, D: d, Err: err})
}

func (o *Observer) Acked(n int, d time.Duration, err error) {
	o.add(ObservedCall{Method: "Acked", N: n, D: d, Err: err})
}

func (o *Observer) Failed(l *pgtransport.Lease, outcome string, d time.Duration, err error) {
	o.add(ObservedCall{Method: "Failed", Lease: l, Outcome: outcome, D: d, Err: err})
}

func (o *Observer) LeaseLost(l *pgtransport.Lease) {
	o.add(ObservedCall{Method: "LeaseLost", Lease: l})
}

func (o *Observer) Handled(l *pgtransport.Lease, d time.Duration, err error) {
	o.add(ObservedCall{Method: "Handled", Lease: l, D: d, Err: err})
}

// Calls returns the calls of method so far ("" for all), in order.
func (o *Observer) Calls(method string) []ObservedCall {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []ObservedCall
	for _, c := range o.calls {
		if method == "" || c.Method == method {
			out = append(out, c)
		}
	}
	return out
}

// Reset forgets the calls so far.
func (o *Observer) Reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls = nil
}
