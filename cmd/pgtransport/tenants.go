package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgtransport/pgtransport"
)

type tenantJSON struct {
	Tenant    string   `json:"tenant"`
	Weight    int      `json:"weight"`
	Groups    int64    `json:"groups"`
	Leased    int64    `json:"leased"`
	Ready     int64    `json:"ready"`
	Share     float64  `json:"share"`
	Delivered int64    `json:"delivered"`
	PerSecond *float64 `json:"per_second"` // null with --window 0
	Measured  *float64 `json:"measured"`   // null with --window 0
}

func (a *app) tenantsCmd() *cobra.Command {
	var (
		asJSON bool
		window time.Duration
	)
	cmd := &cobra.Command{
		Use:   "tenants",
		Short: "List the tenants with their weights, shares and deliveries, or set a weight",
		Long: `tenants lists each tenant that has groups, a weight or deliveries: its
weight, its groups, those leased now (in flight), those waiting their turn
(READY), its share (its weight over the weights of the tenants with groups
waiting: what it is handed out under contention), the messages handed out
from its groups so far (DELIVERED), and over --window (two readings that
far apart) its deliveries per second and its measured share of them, to
set beside SHARE. A group's tenant is set by its first publish
(Message.Tenant; "default" where none is named). Each reading reads every
group row.

tenants set TENANT WEIGHT sets a tenant's weight, 1 to 1000 (a tenant never
set weighs 1): every consumer, plain SQL ones too, applies it to the
tenant's groups from their next turn on.`,
		Example: `  pgtransport tenants
  pgtransport tenants --window 10s
  pgtransport tenants set acme 3`,
		Args: a.exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			if window < 0 {
				return usageErrorf("--window %s: want 0 (no rates) or more", window)
			}
			ctx := cmd.Context()
			tr, err := a.transport(ctx)
			if err != nil {
				return err
			}
			ts, err := tr.Tenants(ctx)
			if err != nil {
				return err
			}
			var rates []pgtransport.TenantRate
			if window > 0 {
				start := time.Now()
				select {
				case <-time.After(window):
				case <-ctx.Done():
					return ctx.Err()
				}
				prev := ts
				if ts, err = tr.Tenants(ctx); err != nil {
					return err
				}
				rates = pgtransport.Rates(prev, ts, time.Since(start))
			}
			if asJSON {
				out := []tenantJSON{}
				for i, t := range ts {
					j := tenantJSON{Tenant: t.Tenant, Weight: t.Weight, Groups: t.Groups, Leased: t.Leased, Ready: t.Ready,
						Share: t.Share, Delivered: t.Delivered}
					if rates != nil {
						j.PerSecond, j.Measured = &rates[i].PerSecond, &rates[i].Measured
					}
					out = append(out, j)
				}
				return writeJSON(cmd.OutOrStdout(), out)
			}
			t := newTable(cmd.OutOrStdout(), "TENANT", "WEIGHT", "GROUPS", "LEASED", "READY", "SHARE", "DELIVERED", "PER SEC", "MEASURED")
			for i, ti := range ts {
				perSec, measured := "-", "-"
				if rates != nil {
					perSec, measured = fmt.Sprintf("%.1f", rates[i].PerSecond), fmt.Sprintf("%.1f%%", 100*rates[i].Measured)
				}
				t.row(ti.Tenant, fmt.Sprint(ti.Weight), fmt.Sprint(ti.Groups), fmt.Sprint(ti.Leased), fmt.Sprint(ti.Ready),
					fmt.Sprintf("%.1f%%", 100*ti.Share), fmt.Sprint(ti.Delivered), perSec, measured)
			}
			return t.flush()
		},
	}
	cmd.Flags().DurationVar(&window, "window", time.Second, "read twice this far apart for deliveries per second and the measured share (0: one reading, no rates)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: an array of tenants")
	cmd.AddCommand(&cobra.Command{
		Use:   "set TENANT WEIGHT",
		Short: "Set a tenant's weight (1 to 1000)",
		Args:  a.exactArgs("TENANT", "WEIGHT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			w, err := strconv.Atoi(args[1])
			if err != nil {
				return usageErrorf("WEIGHT %q: want a whole number from 1 to %d", args[1], pgtransport.MaxTenantWeight)
			}
			ctx := cmd.Context()
			tr, err := a.transport(ctx)
			if err != nil {
				return err
			}
			if err := tr.SetTenantWeight(ctx, args[0], w); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "tenant %q weighs %d\n", args[0], w)
			return nil
		},
	})
	return cmd
}
