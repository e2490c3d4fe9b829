package dashboard

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

func TestRates(t *testing.T) {
	t.Parallel()
	at := time.Unix(1_000_000, 0)
	mk := func(sec int, seq, msgs, dead, deleted int64, exact bool) sample {
		return sample{Published: seq, Deleted: deleted, Stats: pgtransport.Stats{At: at.Add(time.Duration(sec) * time.Second), Total: pgtransport.PriorityStats{
			Priority: -1, Messages: msgs, MessagesExact: exact, DeadLetters: dead, DeadLettersExact: true,
		}}}
	}
	f := func(p *float64) float64 {
		if p == nil {
			return -1
		}
		return *p
	}
	for _, c := range []struct {
		name       string
		prev, cur  sample
		pub, acked float64 // -1: unknown
	}{
		// 100 published, depth up 40, 10 died: 50 acked, in 2 s.
		{"exact", mk(0, 1000, 500, 5, 0, true), mk(2, 1100, 540, 15, 0, true), 50, 25},
		// The same by the delete counter: 60 rows went, 10 of them died.
		{"estimated depth", mk(0, 1000, 500, 5, 7000, false), mk(2, 1100, 999_999, 15, 7060, false), 50, 25},
		{"estimated depth, no counter", mk(0, 1000, 500, 5, -1, false), mk(2, 1100, 540, 15, -1, false), 50, -1},
		{"counter reset", mk(0, 1000, 500, 5, 7000, false), mk(2, 1100, 540, 15, 3, false), 50, -1},
		{"sequence reset", mk(0, 1000, 500, 5, 0, true), mk(2, 10, 540, 15, 0, true), -1, -1},
		{"same instant", mk(0, 1000, 500, 5, 0, true), mk(0, 1100, 540, 15, 0, true), -1, -1},
		// A race between the reads never makes a negative rate.
		{"negative", mk(0, 1000, 500, 5, 0, true), mk(1, 1000, 510, 5, 0, true), 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			pub, acked := rates(c.prev, c.cur)
			is.Equal(f(pub), c.pub)     // published per second
			is.Equal(f(acked), c.acked) // acked per second
		})
	}
	is := is.New(t)
	ps := points([]sample{mk(0, 1, 1, 0, 0, true), mk(1, 2, 1, 0, 0, true)})
	is.Equal(len(ps), 2)
	is.True(ps[0].Published == nil && ps[0].Acked == nil) // the first point has no rate
	is.Equal(f(ps[1].Published), 1.0)
	is.Equal(ps[1].T, 1_000_001.0)
}

func TestFormat(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -1000: "-1,000"} {
		is.Equal(num(n), want) // thousands separators
	}
}

func TestHostAllowed(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	s := &Server{cfg: Config{Hosts: []string{"queue.internal"}}}
	for host, ok := range map[string]bool{
		"127.0.0.1:8080": true, "[::1]:8080": true, "localhost:8080": true, "LOCALHOST": true, "10.1.2.3": true,
		"queue.internal:8080": true, "evil.example:8080": false, "127.0.0.1.nip.io:8080": false, "": false,
	} {
		is.Equal(s.hostAllowed(host), ok) // Host header
	}
}

func TestTarget(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	do, a, g, _, err := target(url.Values{"do": {"pause"}, "group": {"x/y z"}})
	is.NoErr(err)
	is.Equal(do, "pause")
	is.Equal(g, "x/y z")
	is.Equal(back(a, g, 0), "/group?g=x%2Fy+z")
	_, a, _, seq, err := target(url.Values{"do": {"redrive"}, "seq": {"42"}})
	is.NoErr(err)
	is.Equal(back(a, "", seq), "/dead/letter?seq=42")
	for _, v := range []url.Values{{"do": {"drop"}}, {"do": {"pause"}}, {"do": {"redrive"}, "seq": {"0"}}, {"do": {"deadpurge"}, "seq": {"x"}}} {
		_, _, _, _, err := target(v)
		is.True(err != nil) // refused
	}
}

func TestNewChecksConfig(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	_, err := New(Config{})
	is.True(err != nil && strings.Contains(err.Error(), "required"))
}
