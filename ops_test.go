package pgtransport_test

import (
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// TestRates: deliveries per second and measured shares between two
// readings of Tenants, a tenant new in the second counting from 0, and no
// rate from a zero elapsed or from counts that went back.
func TestRates(t *testing.T) {
	is := is.New(t)
	prev := []pgtransport.TenantInfo{{Tenant: "a", Delivered: 100}, {Tenant: "b", Delivered: 50}, {Tenant: "gone", Delivered: 9}}
	cur := []pgtransport.TenantInfo{{Tenant: "a", Delivered: 400}, {Tenant: "b", Delivered: 150}, {Tenant: "new", Delivered: 100}}
	is.Equal(pgtransport.Rates(prev, cur, 2*time.Second), []pgtransport.TenantRate{
		{Tenant: "a", PerSecond: 150, Measured: 0.6},
		{Tenant: "b", PerSecond: 50, Measured: 0.2},
		{Tenant: "new", PerSecond: 50, Measured: 0.2},
	})
	is.Equal(pgtransport.Rates(prev, cur, 0), []pgtransport.TenantRate{{Tenant: "a"}, {Tenant: "b"}, {Tenant: "new"}})
	back := []pgtransport.TenantInfo{{Tenant: "a", Delivered: 10}}
	is.Equal(pgtransport.Rates(prev, back, time.Second), []pgtransport.TenantRate{{Tenant: "a"}}) // went back: none
}
