package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/pgtransport/pgtransport"
)

type tenantJSON struct {
	Tenant string  `json:"tenant"`
	Weight int     `json:"weight"`
	Groups int64   `json:"groups"`
	Leased int64   `json:"leased"`
	Ready  int64   `json:"ready"`
	Share  float64 `json:"share"`
}

func (a *app) tenantsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "tenants",
		Short: "List the tenants with their weights and shares, or set a weight",
		Long: `tenants lists each tenant that has groups or a weight: its weight, its
groups, those leased now, those waiting their turn (READY), and its share
(its weight over the weights of the tenants with groups waiting: what it is
handed out under contention). A group's tenant is set by its first publish
(Message.Tenant; "default" where none is named). It reads every group row.

tenants set TENANT WEIGHT sets a tenant's weight, 1 to 1000 (a tenant never
set weighs 1): every consumer, plain SQL ones too, applies it to the
tenant's groups from their next turn on.`,
		Example: `  pgtransport tenants
  pgtransport tenants set acme 3`,
		Args: a.exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			tr, err := a.transport(ctx)
			if err != nil {
				return err
			}
			ts, err := tr.Tenants(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				out := []tenantJSON{}
				for _, t := range ts {
					out = append(out, tenantJSON(t))
				}
				return writeJSON(cmd.OutOrStdout(), out)
			}
			t := newTable(cmd.OutOrStdout(), "TENANT", "WEIGHT", "GROUPS", "LEASED", "READY", "SHARE")
			for _, ti := range ts {
				t.row(ti.Tenant, fmt.Sprint(ti.Weight), fmt.Sprint(ti.Groups), fmt.Sprint(ti.Leased), fmt.Sprint(ti.Ready),
					fmt.Sprintf("%.1f%%", 100*ti.Share))
			}
			return t.flush()
		},
	}
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
