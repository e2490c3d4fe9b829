package sync_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// hostile are group ids and events that try SQL injection, quoting,
// escapes, Unicode, NUL, broken UTF-8 and size: each either round-trips
// byte for byte or is refused with a typed error.
var hostile = []struct{ group, event string }{
	{"g", "e"},
	{"'; DROP TABLE transport_messages; --", "x"},
	{"g", "'); DELETE FROM transport_groups; --"},
	{`"quoted" \backslash\ $1 $$ %s`, `{"json": "\u0000"}`},
	{"Ünïcødé 日本語 🙂", "事件 🚀"},
	{" ", " "},
	{"a\x00b", "e"},
	{"g", "bad\x00event"},
	{"\xff\xfe", "e"},
	{"g", "\xc3\x28"},
	{"", "e"},
	{strings.Repeat("g", pgtransport.MaxGroupBytes), "longest group id"},
	{strings.Repeat("g", pgtransport.MaxGroupBytes+1), "e"},
	{strings.Repeat("x", 10<<10), "10 KB group id"},
	{"g", strings.Repeat("e", 10<<10)},
	{"g", strings.Repeat("e", 64<<10+1)},
}

// roundTrip publishes group/event on an empty queue: refused with a typed
// error and nothing written, or claimed back byte for byte and acked.
func roundTrip(t *testing.T, tr *pgsync.Transport, db *pgtest.DB, group, event string) {
	t.Helper()
	empty := func() {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx(t), `SELECT (SELECT count(*) FROM transport_messages) + (SELECT count(*) FROM transport_groups WHERE drained_at IS NULL)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("group %q: %d rows left", group, n)
		}
	}
	_, err := tr.Publish(ctx(t), group, event, 0)
	if err != nil {
		if !errors.Is(err, pgtransport.ErrInvalidGroup) && !errors.Is(err, pgtransport.ErrInvalidEvent) && !errors.Is(err, pgtransport.ErrEventTooLarge) {
			t.Fatalf("group %q: untyped error %v", group, err)
		}
		empty()
		return
	}
	l, err := tr.Claim(ctx(t), "w", time.Minute, 0)
	if err != nil || l == nil {
		t.Fatalf("group %q: claim %v, %v", group, l, err)
	}
	if l.Group != group || l.Event != event {
		t.Fatalf("got %q/%q back, published %q/%q", l.Group, l.Event, group, event)
	}
	if err := tr.Ack(ctx(t), l); err != nil {
		t.Fatal(err)
	}
	empty()
}

func fuzzTransport(tb testing.TB) (*pgsync.Transport, *pgtest.DB) {
	db := pgtest.New(tb, 4)
	tr, err := pgsync.New(ctx(tb), db.Pool, pgtransport.Config{Schema: db.Schema, MaxEventBytes: 64 << 10})
	if err != nil {
		tb.Fatal(err)
	}
	return tr, db
}

func TestHostileInput(t *testing.T) {
	t.Parallel()
	tr, db := fuzzTransport(t)
	for _, h := range hostile {
		roundTrip(t, tr, db, h.group, h.event)
	}
	var n int
	if err := db.Pool.QueryRow(ctx(t), `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, db.Schema).Scan(&n); err != nil || n != 12 {
		t.Fatalf("the schema holds %d tables (%v), want its 12", n, err)
	}
}

// FuzzPublish: any group and event round-trip byte for byte through claim,
// or are refused with a typed error and leave nothing written. make test
// runs it briefly; make fuzz runs it long.
func FuzzPublish(f *testing.F) {
	for _, h := range hostile {
		f.Add(h.group, h.event)
	}
	tr, db := fuzzTransport(f)
	f.Fuzz(func(t *testing.T, group, event string) {
		roundTrip(t, tr, db, group, event)
	})
}
