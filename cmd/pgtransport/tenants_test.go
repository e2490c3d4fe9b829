package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// TestTenants: tenants lists each tenant with its weight, groups, leased
// and ready groups, share and deliveries (rates over --window); groups
// --tenant lists one tenant's groups; tenants set sets a weight; a bad
// tenant or weight is a usage error (exit 2) and writes nothing.
func TestTenants(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, true)
	tr := h.transport(pgtransport.Config{})
	ctx := context.Background()
	for _, m := range []pgtransport.Message{
		{Group: "a1", Event: "e", Tenant: "acme"},
		{Group: "a2", Event: "e", Tenant: "acme"},
		{Group: "d1", Event: "e"},
	} {
		_, err := tr.PublishMessage(ctx, m)
		is.NoErr(err)
	}
	is.Equal(h.ok("", "tenants", "set", "acme", "3").stdout, "tenant \"acme\" weighs 3\n")

	out := h.ok("", "tenants", "--window", "0").stdout
	lines := strings.Split(strings.TrimSpace(out), "\n")
	is.Equal(len(lines), 3) // the header, acme, default
	is.Equal(strings.Fields(lines[0]), []string{"TENANT", "WEIGHT", "GROUPS", "LEASED", "READY", "SHARE", "DELIVERED", "PER", "SEC", "MEASURED"})
	is.Equal(strings.Fields(lines[1]), []string{"acme", "3", "2", "0", "2", "75.0%", "0", "-", "-"})
	is.Equal(strings.Fields(lines[2]), []string{"default", "1", "1", "0", "1", "25.0%", "0", "-", "-"})

	var ts []tenantJSON
	decode(t, h.ok("", "tenants", "--json", "--window", "0").stdout, &ts)
	is.Equal(ts, []tenantJSON{
		{Tenant: "acme", Weight: 3, Groups: 2, Ready: 2, Share: 0.75},
		{Tenant: "default", Weight: 1, Groups: 1, Ready: 1, Share: 0.25},
	})

	// Two groups handed out (one of each: the weight came after their
	// entries), then two readings with none handed out between them:
	// delivered counts them, the rates are 0.
	for range 2 {
		_, err := tr.Claim(ctx, "w", time.Minute, 0)
		is.NoErr(err)
	}
	decode(t, h.ok("", "tenants", "--json", "--window", "100ms").stdout, &ts)
	is.Equal(len(ts), 2)
	is.Equal([]int64{ts[0].Delivered, ts[0].Leased, ts[1].Delivered, ts[1].Leased}, []int64{1, 1, 1, 1})
	is.True(ts[0].PerSecond != nil && *ts[0].PerSecond == 0 && *ts[0].Measured == 0)

	var gs []groupJSON
	decode(t, h.ok("", "groups", "--tenant", "acme", "--json").stdout, &gs)
	is.Equal(len(gs), 2)
	is.Equal([]string{gs[0].Tenant, gs[1].Tenant}, []string{"acme", "acme"}) // only acme's groups
	h.fails(exitUsage, "", []string{"groups", "--tenant", strings.Repeat("t", pgtransport.MaxTenantBytes+1)}, "invalid tenant")
	h.fails(exitUsage, "", []string{"tenants", "--window", "-1s"}, "--window")

	h.fails(exitUsage, "", []string{"tenants", "set", "", "2"}, "invalid tenant")
	h.fails(exitUsage, "", []string{"tenants", "set", strings.Repeat("t", pgtransport.MaxTenantBytes+1), "2"}, "invalid tenant")
	h.fails(exitUsage, "", []string{"tenants", "set", "acme", "0"}, "invalid tenant weight")
	h.fails(exitUsage, "", []string{"tenants", "set", "acme", "1001"}, "invalid tenant weight")
	h.fails(exitUsage, "", []string{"tenants", "set", "acme", "x"}, "WEIGHT")
	decode(t, h.ok("", "tenants", "--json", "--window", "0").stdout, &ts)
	is.Equal(ts[0].Weight, 3) // unchanged by the refused calls
	is.Equal(len(ts), 2)      // and no tenant added
}
