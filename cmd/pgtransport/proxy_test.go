package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestOnAProxy: pointed at a PL/Proxy proxy over four partitions, the
// command publishes, and its operator's reads and actions see the whole
// cluster: stats add up over the partitions, listings merge them, a group
// is paused, resumed and purged on its partition; the dashboard's counters
// add up too. A queue's migrate apply is refused there; --proxy checks it.
func TestOnAProxy(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Partitions(t, 4)
	h := &harness{t: t, schema: p.Schema, pool: p.Proxy, dsn: p.ProxyDSN}

	var v struct{ Recorded, Library int }
	is.NoErr(json.Unmarshal([]byte(h.ok("", "migrate", "version", "--json").stdout), &v))
	is.Equal(v.Recorded, v.Library) // the proxy's version

	var in strings.Builder
	for i := range 8 {
		fmt.Fprintf(&in, "{\"group\": \"px-%d\", \"event\": \"e%d\", \"priority\": %d}\n", i, i, i%5)
	}
	h.ok(in.String(), "publish")
	var sum, holding int
	for _, part := range p.Parts {
		var n int
		is.NoErr(part.QueryRow(context.Background(), `SELECT count(*) FROM transport_messages`).Scan(&n))
		sum += n
		if n > 0 {
			holding++
		}
	}
	is.Equal(sum, 8)
	is.True(holding > 1) // spread over partitions

	var st struct {
		Total struct{ Groups, Messages int64 }
	}
	is.NoErr(json.Unmarshal([]byte(h.ok("", "stats", "--json").stdout), &st))
	is.Equal(st.Total.Groups, int64(8)) // the partitions' added up
	is.Equal(st.Total.Messages, int64(8))

	var groups []struct{ Group string }
	is.NoErr(json.Unmarshal([]byte(h.ok("", "groups", "--json").stdout), &groups))
	is.Equal(len(groups), 8)
	is.Equal(groups[0].Group, "px-0") // merged in id order
	is.True(strings.Contains(h.ok("", "peek", "px-3").stdout, "e3"))

	h.ok("", "pause", "px-2")
	is.NoErr(json.Unmarshal([]byte(h.ok("", "groups", "--state", "paused", "--json").stdout), &groups))
	is.Equal(len(groups), 1)
	is.Equal(groups[0].Group, "px-2")
	h.ok("", "resume", "px-2")
	h.ok("", "purge", "px-5", "--yes")
	h.fails(3, "", []string{"group", "px-5"}, "unknown group")
	h.ok("", "dead", "list")

	var published int64
	is.NoErr(p.Proxy.QueryRow(context.Background(), `SELECT sum(published)::BIGINT FROM harel_counters()`).Scan(&published))
	is.Equal(published, int64(8)) // the dashboard's counter, over all partitions

	h.fails(2, "", []string{"migrate", "apply"}, "proxy")
	is.True(strings.Contains(h.ok("", "migrate", "apply", "--proxy").stdout, "up to date"))
}

// TestMigrateProxyFlags: the set-up flags refuse what cannot be meant
// before they connect, and migrate sql --proxy prints the proxy's script.
func TestMigrateProxyFlags(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, false)
	h.fails(2, "", []string{"migrate", "apply", "--partition", "1024"}, "0 to 1023")
	h.fails(2, "", []string{"migrate", "apply", "--proxy", "--partition", "0"}, "one or the other")
	var n int
	is.NoErr(h.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, h.schema).Scan(&n))
	is.Equal(n, 0) // nothing written
	out := h.ok("", "migrate", "sql", "--proxy").stdout
	is.True(strings.Contains(out, "harel_px_check("))                       // the proxy's script ...
	is.True(!strings.Contains(out, "INSERT INTO transport_schema_version")) // ... not the queue's
}

// TestMigrateGrow: migrate grow grows a queue behind a proxy from two
// partitions to four (the new ones applied and numbered as migrate apply
// --partition does); grow --finish fails, saying what is left, while a
// moving group still has messages in its old partition, and ends the
// growth once they are handled. Bad usage and a second growth without
// new partitions are refused.
func TestMigrateGrow(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	p := pgtest.Growable(t, 2)
	h := &harness{t: t, schema: p.Schema, pool: p.Proxy, dsn: p.ProxyDSN}
	var in strings.Builder
	for i := range 16 {
		fmt.Fprintf(&in, "{\"group\": \"gr-%d\", \"event\": \"e%d\"}\n", i, i)
	}
	h.ok(in.String(), "publish")
	h.fails(2, "", []string{"migrate", "grow", "--finish", "host=x"}, "--finish takes no partitions")
	added, err := p.Prepare(context.Background())
	is.NoErr(err)
	out := h.ok("", append([]string{"migrate", "grow"}, added...)...).stdout
	is.True(strings.Contains(out, "growing from 2 to 4 partitions"))
	h.fails(1, "", []string{"migrate", "grow", "--finish"}, "moving groups still hold")
	for { // handle every message, through the proxy
		var g string
		var seq int64
		err := p.Proxy.QueryRow(context.Background(), `SELECT group_id, seq FROM harel_claim(extract(epoch FROM clock_timestamp()), extract(epoch FROM clock_timestamp()) + 30, 'w')`).Scan(&g, &seq)
		if err != nil {
			break // no rows: drained
		}
		_, err = p.Proxy.Exec(context.Background(), `SELECT harel_ack($1, $2, 'w', extract(epoch FROM clock_timestamp()))`, g, seq)
		is.NoErr(err)
	}
	is.True(strings.Contains(h.ok("", "migrate", "grow", "--finish").stdout, "4 partitions"))
	h.fails(2, "", []string{"migrate", "grow"}, "connection strings")
	h.fails(2, "", []string{"migrate", "grow", "host=x"}, "needs 4 new partitions")
}
