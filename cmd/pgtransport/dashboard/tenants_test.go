package dashboard

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// TestTenantsPage: the tenants page lists each tenant's weight, groups,
// groups in flight, ready groups, share and deliveries, and from its
// second reading the deliveries per second and the measured share since
// the first; a reading serves every view until it is tenantsReadEvery
// old; a tenant's link lists its groups only, and a bad tenant
// there is a 400.
func TestTenantsPage(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	tenantsReadEvery = time.Second // not parallel: no other test reads it
	t.Cleanup(func() { tenantsReadEvery = TenantsRefresh / 2 })
	q := newQueue(t, pgtransport.Config{})
	for _, m := range []pgtransport.Message{
		{Group: "a1", Event: "e", Tenant: "acme"},
		{Group: "a2", Event: "e", Tenant: "acme"},
		{Group: "a3", Event: "e", Tenant: "acme"},
		{Group: "d1", Event: "e"},
	} {
		_, err := q.tr.PublishMessage(ctx, m)
		is.NoErr(err)
	}
	_, base := q.serve(Config{Interval: time.Second})
	get := func(path string, code int) string {
		t.Helper()
		res, err := http.Get(base + path)
		is.NoErr(err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		is.NoErr(err)
		is.Equal(res.StatusCode, code)
		return string(b)
	}
	cells := func(page, tenant string) []string {
		t.Helper()
		_, row, ok := strings.Cut(page, ">"+tenant+"</a></td>")
		is.True(ok) // the tenant has a row
		row, _, _ = strings.Cut(row, "</tr>")
		var out []string
		for c := range strings.SplitSeq(strings.TrimSuffix(row, "</td>"), "</td>") {
			out = append(out, strings.TrimPrefix(c, "<td>"))
		}
		return out
	}
	page := get("/tenants", http.StatusOK)
	is.Equal(get("/tenants", http.StatusOK), page)                                      // the same reading
	is.Equal(cells(page, "acme"), []string{"1", "3", "0", "3", "50.0%", "-", "-", "0"}) // weight, groups, in flight, ready, share, measured, per s, delivered
	is.Equal(cells(page, "default"), []string{"1", "1", "0", "1", "50.0%", "-", "-", "0"})

	ls, err := q.tr.ClaimMany(ctx, "w", time.Minute, 0, 4)
	is.NoErr(err)
	is.Equal(len(ls), 4)
	time.Sleep(tenantsReadEvery)
	page = get("/tenants", http.StatusOK)
	acme, def := cells(page, "acme"), cells(page, "default")
	is.Equal(acme[:6], []string{"1", "3", "3", "0", "0.0%", "75.0%"}) // all in flight, none ready: 3 of the 4 deliveries
	is.Equal(acme[7], "3")
	is.Equal(def[:6], []string{"1", "1", "1", "0", "0.0%", "25.0%"})
	is.True(acme[6] != "-" && acme[6] != "0.0") // a rate over the time since the first reading

	groups := get("/groups?list=all&tenant=acme", http.StatusOK)
	is.True(strings.Contains(groups, `href="/group?g=a1"`))
	is.True(!strings.Contains(groups, `href="/group?g=d1"`)) // acme's groups only
	get("/groups?list=all&tenant="+strings.Repeat("t", pgtransport.MaxTenantBytes+1), http.StatusBadRequest)
}
