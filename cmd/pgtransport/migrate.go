package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/schema"
)

func (a *app) migrateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Print, apply or check the schema; print the grants for a role",
		Long: `migrate handles the queue's schema: the tables and server-side functions.

  migrate sql          print the whole SQL script, for your own migration tool
  migrate apply        create or upgrade the schema (idempotent, one transaction)
  migrate version      print the version recorded in the database and this command's
  migrate grants ROLE  print the GRANT statements that let ROLE work the queue
  migrate grow CONN... grow a partitioned queue from N to 2N partitions (on its proxy)`,
		Args: a.exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.migrateSQLCmd(), a.migrateApplyCmd(), a.migrateVersionCmd(), a.migrateGrantsCmd(), a.migrateGrowCmd())
	return cmd
}

func (a *app) migrateSQLCmd() *cobra.Command {
	var proxy bool
	cmd := &cobra.Command{
		Use:   "sql",
		Short: "Print the schema's SQL script",
		Long: `sql prints the complete SQL script (every step and function) to stdout; it
connects to nothing. Loaded with psql it creates or upgrades the schema in one
transaction. With --schema the script starts by creating that schema and
pointing search_path at it (for the rest of the psql session). With --proxy
it prints a PL/Proxy proxy database's script instead (docs/protocol.md,
"Partitions").`,
		Example: `  pgtransport migrate sql > pgtransport.sql
  pgtransport migrate sql --schema jobs | psql "$DATABASE_URL"`,
		Args: a.exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			if a.schema != "" {
				ident := pgx.Identifier{a.schema}.Sanitize()
				fmt.Fprintf(w, "CREATE SCHEMA IF NOT EXISTS %s;\nSET search_path TO %s;\n", ident, ident)
			}
			script := schema.SQL()
			if proxy {
				script = schema.ProxySQL()
			}
			_, err := fmt.Fprint(w, script)
			return err
		},
	}
	cmd.Flags().BoolVar(&proxy, "proxy", false, "print the PL/Proxy proxy database's script")
	return cmd
}

func (a *app) migrateApplyCmd() *cobra.Command {
	var proxy bool
	var partition int
	cmd := &cobra.Command{
		Use:   "apply",
		Short: "Create or upgrade the schema",
		Long: `apply brings the schema up to this command's version: the steps the database
lacks, then every function, in one transaction under an advisory lock (safe
while workers run or start). On an up-to-date schema it changes nothing.
--schema is created if absent.

A queue spread over partition databases behind a PL/Proxy proxy
(docs/protocol.md, "Partitions"): on each partition, apply --partition N
(N its place in the proxy's cluster, from 0) applies the schema and numbers
the partition; then on the proxy database, apply --proxy installs the
proxy's functions and checks every partition through the cluster.`,
		Args: a.exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			switch {
			case proxy && partition >= 0:
				return usageErrorf("--proxy and --partition: a database is one or the other")
			case partition > 1023 || partition < -1:
				return usageErrorf("--partition %d: a partition's number is 0 to 1023", partition)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			before, err := a.recordedVersion(ctx)
			if err != nil {
				return err
			}
			if proxy {
				err = schema.ApplyProxy(ctx, pool, a.schema)
			} else {
				err = schema.Apply(ctx, pool, a.schema)
				if err == nil && partition >= 0 {
					err = schema.Partition(ctx, pool, a.schema, partition)
				}
			}
			if err != nil {
				return err
			}
			after, err := a.recordedVersion(ctx)
			if err != nil {
				return err
			}
			what := a.schemaLabel()
			switch {
			case proxy:
				what += " (a proxy)"
			case partition >= 0:
				what += fmt.Sprintf(" (partition %d)", partition)
			}
			if before == after {
				fmt.Fprintf(cmd.OutOrStdout(), "%s is up to date at version %d\n", what, after)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s upgraded from version %d to %d\n", what, before, after)
			return nil
		},
	}
	cmd.Flags().BoolVar(&proxy, "proxy", false, "install the PL/Proxy proxy's functions over cluster pgtransport, and check its partitions")
	cmd.Flags().IntVar(&partition, "partition", -1, "number this database partition N of a proxy's cluster (0 to 1023) after applying")
	return cmd
}

func (a *app) migrateVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the schema version recorded in the database and this command's",
		Long: `version prints the schema version recorded in the database (0: not applied)
and the version this command applies. Exit 0 whatever they are: compare them
in a script with --json.`,
		Args: a.exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if _, err := a.connect(ctx); err != nil {
				return err
			}
			v, err := a.recordedVersion(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), struct {
					Schema   string `json:"schema"`
					Recorded int    `json:"recorded"`
					Library  int    `json:"library"`
				}{a.schema, v, schema.Version()})
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "recorded: %d\nlibrary:  %d\n", v, schema.Version())
			switch {
			case v == 0:
				fmt.Fprintf(w, "%s has no pgtransport schema: pgtransport migrate apply creates it\n", a.schemaLabel())
			case v < schema.Version():
				fmt.Fprintf(w, "%s is behind: pgtransport migrate apply upgrades it\n", a.schemaLabel())
			case v > schema.Version():
				fmt.Fprintf(w, "%s is newer than this command: upgrade the command\n", a.schemaLabel())
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: {schema, recorded, library}")
	return cmd
}

func (a *app) migrateGrantsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "grants ROLE",
		Short: "Print the GRANT statements that let ROLE work the queue",
		Long: `grants prints the statements that let ROLE publish, claim, ack and handle
dead letters in the queue's schema, and nothing more (see schema.Grants). It
connects to nothing. ROLE is used verbatim as a quoted identifier, so case,
quotes and punctuation are kept and cannot break out of the statement; an
empty name, or one that is not valid UTF-8 or holds a NUL byte, is refused.`,
		Example: `  pgtransport migrate grants worker --schema jobs | psql "$DATABASE_URL"`,
		Args:    a.exactArgs("ROLE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			sql, err := schema.Grants(a.schema, args[0])
			if err != nil {
				if errors.Is(err, pgtransport.ErrInvalidConfig) {
					return usageErrorf("invalid role name %q: it must be non-empty valid UTF-8 without NUL bytes", args[0])
				}
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), sql)
			return err
		},
	}
}

// recordedVersion is the schema version recorded in a.schema, 0 when the
// schema or its version table does not exist.
func (a *app) recordedVersion(ctx context.Context) (int, error) {
	v, err := schema.CurrentVersion(ctx, a.pool, a.schema)
	if absent(err) {
		// A proxy's schema (docs/protocol.md, "Partitions") records its own.
		v, err = schema.ProxyVersion(ctx, a.pool, a.schema)
	}
	if absent(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return v, nil
}

// absent: the version table or the schema is not there (undefined_table,
// invalid_schema_name): nothing applied.
func absent(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && (pgErr.Code == "42P01" || pgErr.Code == "3F000")
}

func (a *app) migrateGrowCmd() *cobra.Command {
	var finish bool
	cmd := &cobra.Command{
		Use:   "grow [PARTITION...]",
		Short: "Grow a partitioned queue from N to 2N partitions, or end a growth",
		Long: `grow, pointed at a PL/Proxy proxy database (docs/protocol.md, "Growing the
cluster"), grows its queue from the N partitions its proxy was checked with
to 2N. Each PARTITION is a new partition's connection string, as the
proxy's cluster lists the others (libpq key=value), N of them, in order:
databases that hold the queue, applied and numbered N to 2N-1 (migrate
apply --partition), and empty. In one transaction it adds them to cluster
pgtransport and arms every partition: from then on a group whose home
changed stays in its old partition while it has anything there (messages,
a lease, dead letters, a kept state, a dedup key), and lives in its new one
after. Reopen the Go clients: ones opened before are refused publishes of
groups that have moved.

grow --finish ends the growth once no old partition holds anything of a
moving group: it fails (exit 1) saying what is left while any does. Rows
drain as their messages are handled, kept states and keys expire, and dead
letters wait for a redrive or a purge.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			switch {
			case finish && len(args) > 0:
				return usageErrorf("--finish takes no partitions")
			case !finish && len(args) == 0:
				return usageErrorf("grow needs the new partitions' connection strings, as many as the cluster has now (or --finish)")
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			if finish {
				n, err := schema.Grown(ctx, pool, a.schema)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: the cluster has %d partitions; every group lives in its home\n", a.schemaLabel(), n)
				return nil
			}
			n, err := schema.Grow(ctx, pool, a.schema, args)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: growing from %d to %d partitions; moving groups drain in their old ones (grow --finish ends it once they have)\n", a.schemaLabel(), n/2, n)
			return nil
		},
	}
	cmd.Flags().BoolVar(&finish, "finish", false, "end the growth, once the old partitions hold nothing of a moving group")
	return cmd
}
