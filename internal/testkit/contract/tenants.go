package contract

import (
	"errors"
	"fmt"
	"strings"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// tenantsCases: a group belongs to its first publish's tenant, claims
// share among tenants by weight whatever their number of groups, and a
// bad tenant or weight writes nothing (docs/design.md, "Shares across
// tenants").
var tenantsCases = []testCase{
	{"TenantsShareClaims", tenantsShareClaims},
	{"TenantWeightsAndListing", tenantWeightsAndListing},
	{"BadTenantWritesNothing", badTenantWritesNothing},
}

// tenantsShareClaims: a tenant with 100 ready groups and 9 tenants with 2
// each, published in that order: claims of one hand out every light
// tenant's group within two rounds of the 10 tenants on each partition
// (20 hand-outs a partition), not after the 100.
func tenantsShareClaims(is *is.I, e *env) {
	var msgs []pgtransport.Message
	for i := range 100 {
		msgs = append(msgs, pgtransport.Message{Group: fmt.Sprintf("s%03d", i), Event: "e", Tenant: "sybil"})
	}
	_, err := e.tr.PublishMany(e.ctx(), msgs)
	is.NoErr(err)
	msgs = nil
	for l := range 9 {
		for i := range 2 {
			msgs = append(msgs, pgtransport.Message{Group: fmt.Sprintf("l%d-%d", l, i), Event: "e", Tenant: fmt.Sprintf("light%d", l)})
		}
	}
	_, err = e.tr.PublishMany(e.ctx(), msgs)
	is.NoErr(err)
	last := 0 // the last light group's place
	for i := range 118 {
		l := e.claim("w", 0)
		if l == nil {
			e.t.Fatalf("claim %d: nothing claimable", i)
		}
		if strings.HasPrefix(l.Group, "l") {
			last = i + 1
		}
		e.ack(l)
	}
	is.True(last <= 20*e.n) // every light group within two rounds of the tenants on each partition
}

// tenantWeightsAndListing: a group's tenant is its first publish's
// (DefaultTenant where it names none), a weight is kept, and Tenants
// lists each tenant with its groups, leased groups, ready groups, share
// and deliveries; Groups lists one tenant's.
func tenantWeightsAndListing(is *is.I, e *env) {
	op := e.op()
	e.publishMessage(e.tr, pgtransport.Message{Group: "a1", Event: "e", Tenant: "acme"})
	e.publishMessage(e.tr, pgtransport.Message{Group: "a1", Event: "e", Tenant: "other"}) // not its first publish
	e.publishMessage(e.tr, pgtransport.Message{Group: "a2", Event: "e", Tenant: "acme"})
	e.publishMessage(e.tr, pgtransport.Message{Group: "d1", Event: "e"})
	is.Equal(e.textAt("a1", `SELECT tenant FROM transport_groups WHERE group_id = 'a1'`), "acme")
	is.Equal(e.textAt("d1", `SELECT tenant FROM transport_groups WHERE group_id = 'd1'`), pgtransport.DefaultTenant)
	is.NoErr(op.SetTenantWeight(e.ctx(), "acme", 3))
	is.NoErr(op.SetTenantWeight(e.ctx(), "idle", 2))
	l := e.claim("w", 0)
	if l == nil {
		e.t.Fatal("nothing claimable")
	}
	ts, err := op.Tenants(e.ctx())
	is.NoErr(err)
	byName := map[string]pgtransport.TenantInfo{}
	for _, t := range ts {
		byName[t.Tenant] = t
	}
	is.Equal(len(ts), 3) // acme, default and idle, in tenant order
	is.Equal(ts[0].Tenant, "acme")
	acme, def, idle := byName["acme"], byName[pgtransport.DefaultTenant], byName["idle"]
	is.Equal(acme.Weight, 3)
	is.Equal(acme.Groups, int64(2))
	is.Equal(def.Weight, 1)
	is.Equal(def.Groups, int64(1))
	is.Equal(acme.Leased+def.Leased, int64(1)) // the one claimed
	is.Equal(acme.Ready+def.Ready, int64(2))   // the other two wait
	is.Equal(idle.Groups, int64(0))
	is.Equal(idle.Share, 0.0) // no ready group, no share
	switch {
	case acme.Ready > 0 && def.Ready > 0:
		is.Equal(acme.Share, 0.75)
	case acme.Ready > 0:
		is.Equal(acme.Share, 1.0)
	default:
		is.Equal(def.Share, 1.0)
	}
	is.Equal(acme.Delivered+def.Delivered, int64(1)) // the one claimed was handed out once
	gs, err := op.Groups(e.ctx(), pgtransport.GroupQuery{Tenant: "acme"})
	is.NoErr(err)
	is.Equal(len(gs), 2) // acme's groups only, each with its tenant
	is.Equal([]string{gs[0].Group, gs[0].Tenant, gs[1].Group, gs[1].Tenant}, []string{"a1", "acme", "a2", "acme"})
	g, err := op.Group(e.ctx(), "d1")
	is.NoErr(err)
	is.Equal(g.Tenant, pgtransport.DefaultTenant)
	_, err = op.Groups(e.ctx(), pgtransport.GroupQuery{Tenant: strings.Repeat("t", pgtransport.MaxTenantBytes+1)})
	is.True(errors.Is(err, pgtransport.ErrInvalidTenant))
	e.ack(l)
	ts, err = op.Tenants(e.ctx())
	is.NoErr(err)
	var delivered int64
	for _, t := range ts {
		delivered += t.Delivered
	}
	is.Equal(delivered, int64(1)) // an ack hands nothing out
}

// badTenantWritesNothing: a tenant too long, not UTF-8 or with a NUL is
// refused by every publish, an empty tenant and a weight out of range by
// SetTenantWeight, each before anything is written.
func badTenantWritesNothing(is *is.I, e *env) {
	op := e.op()
	tx := e.begin("g")
	bad := map[string]string{
		"TooLong":     strings.Repeat("t", pgtransport.MaxTenantBytes+1),
		"InvalidUTF8": "a\xffb",
		"NUL":         "a\x00b",
	}
	for name, tenant := range bad {
		msg := pgtransport.Message{Group: "g", Event: "x", Tenant: tenant}
		if _, err := e.tr.PublishMessage(e.ctx(), msg); !errors.Is(err, pgtransport.ErrInvalidTenant) {
			e.t.Errorf("PublishMessage, tenant %s: got %v, want ErrInvalidTenant", name, err)
		}
		if _, err := e.tr.PublishMessageTx(e.ctx(), tx, msg); !errors.Is(err, pgtransport.ErrInvalidTenant) {
			e.t.Errorf("PublishMessageTx, tenant %s: got %v, want ErrInvalidTenant", name, err)
		}
		if _, err := e.tr.PublishMany(e.ctx(), []pgtransport.Message{{Group: "g", Event: "fine", Tenant: "fine"}, msg}); !errors.Is(err, pgtransport.ErrInvalidTenant) {
			e.t.Errorf("PublishMany, tenant %s: got %v, want ErrInvalidTenant", name, err)
		}
		if err := op.SetTenantWeight(e.ctx(), tenant, 2); !errors.Is(err, pgtransport.ErrInvalidTenant) {
			e.t.Errorf("SetTenantWeight, tenant %s: got %v, want ErrInvalidTenant", name, err)
		}
	}
	if err := op.SetTenantWeight(e.ctx(), "", 2); !errors.Is(err, pgtransport.ErrInvalidTenant) {
		e.t.Errorf("SetTenantWeight of an empty tenant: got %v, want ErrInvalidTenant", err)
	}
	for _, w := range []int{0, -1, pgtransport.MaxTenantWeight + 1} {
		if err := op.SetTenantWeight(e.ctx(), "t", w); !errors.Is(err, pgtransport.ErrInvalidWeight) {
			e.t.Errorf("SetTenantWeight(%d): got %v, want ErrInvalidWeight", w, err)
		}
	}
	is.NoErr(tx.Rollback(e.ctx()))
	messages, groups := e.rows()
	is.Equal(messages+groups, 0)                                   // nothing published
	is.Equal(e.count(`SELECT count(*) FROM transport_tenants`), 0) // no weight written
}
