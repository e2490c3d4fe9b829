package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/schema"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// Exit codes; see the package doc.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitNotFound    = 3
	exitInterrupted = 130
)

// env is the process around the command: main fills it from the OS, tests
// with buffers.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	// stdinTTY: ask for confirmation (else require --yes). stderrTTY: draw
	// progress bars.
	stdinTTY, stderrTTY bool
	// beforeBatch, if set, is called before each batch of a long operation
	// with the batch's number (from 1). Tests use it to interrupt one.
	beforeBatch func(n int)
}

// exitError carries the exit code an error should give.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageErrorf is bad input from the command line or stdin: exit 2.
func usageErrorf(format string, args ...any) error {
	return &exitError{exitUsage, fmt.Errorf(format, args...)}
}

// interruptedErrorf is a long operation stopped between batches by
// Ctrl-C: exit 130.
func interruptedErrorf(format string, args ...any) error {
	return &exitError{exitInterrupted, fmt.Errorf(format, args...)}
}

// exitCode maps an error to the documented exit code.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	if ee, ok := errors.AsType[*exitError](err); ok {
		return ee.code
	}
	switch {
	case errors.Is(err, context.Canceled):
		return exitInterrupted
	case errors.Is(err, pgtransport.ErrUnknownGroup):
		return exitNotFound
	case errors.Is(err, pgtransport.ErrInvalidGroup),
		errors.Is(err, pgtransport.ErrInvalidSchema),
		errors.Is(err, pgtransport.ErrInvalidQuery),
		errors.Is(err, pgtransport.ErrInvalidBatch),
		errors.Is(err, pgtransport.ErrInvalidConfig),
		errors.Is(err, pgtransport.ErrInvalidEvent),
		errors.Is(err, pgtransport.ErrEventTooLarge),
		errors.Is(err, pgtransport.ErrInvalidPriority),
		errors.Is(err, pgtransport.ErrInvalidDedupKey),
		errors.Is(err, pgtransport.ErrInvalidTenant),
		errors.Is(err, pgtransport.ErrInvalidWeight):
		return exitUsage
	}
	return exitFailed
}

// run runs the command line args and returns the exit code. Errors are
// printed to e.stderr.
func run(ctx context.Context, args []string, e *env) int {
	a := &app{env: e}
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	err := root.ExecuteContext(ctx)
	if a.pool != nil {
		a.pool.Close()
	}
	if err == nil {
		return exitOK
	}
	code := exitCode(err)
	if !a.started {
		// Cobra refused the command line before any command ran: an
		// unknown command or flag, a bad flag value, a wrong argument count.
		code = exitUsage
	}
	msg := err.Error()
	if errors.Is(err, pgtransport.ErrUnknownGroup) && a.group != "" {
		// The library's error ends in the server's; say it plainly.
		msg = fmt.Sprintf("unknown group %q: it has no row (never published to, or drained)", a.group)
	}
	if errors.Is(err, pgtransport.ErrSchemaMissing) && !strings.Contains(msg, "migrate apply") {
		msg += "\n(apply the schema first: pgtransport migrate apply)"
	}
	fmt.Fprintf(e.stderr, "pgtransport: %s\n", strings.TrimPrefix(msg, "pgtransport: ")) // the library's errors carry the name too
	if code == exitUsage && !a.started {
		fmt.Fprintf(e.stderr, "Run 'pgtransport --help' for usage.\n")
	}
	return code
}

// app is one run: the global flags and the connection, opened on demand.
type app struct {
	env     *env
	dsn     string
	schema  string
	started bool // a command's PersistentPreRunE was reached
	// group is the GROUP argument of the command that ran, if any.
	group string
	// maxEvent is the transport's Config.MaxEventBytes (0: the default).
	maxEvent int

	pool *pgxpool.Pool
}

const rootLong = `pgtransport operates a pgtransport queue: the schema, the queue's depth and
groups, pause/resume/purge of a group, dead letters, publishing from
scripts, Prometheus metrics, and a live dashboard (serve).

It connects to --dsn (default $DATABASE_URL; empty: libpq's defaults) and
works on the queue in --schema (default: the connection's current schema).

Tables are for people; --json prints the data for scripts. Long operations
(purge, dead redrive, dead purge, publish) work in batches, each one
transaction, and show a progress bar when stderr is a terminal (nothing
when piped). Ctrl-C stops them between batches: the batch in flight
finishes, the command says how far it got and exits 130. purge and
dead purge ask for confirmation on a terminal and need --yes otherwise.

Exit codes:
  0    success
  1    the operation failed (database, connection, schema missing or too
       old), or a confirmation was declined
  2    usage or bad input (unknown command or flag, bad value, bad schema
       name, invalid group id, malformed stdin); nothing was written
  3    not found (unknown group)
  130  interrupted by Ctrl-C (whole batches only were done)`

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "pgtransport",
		Short:         "Operate a pgtransport queue",
		Long:          rootLong,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			a.started = true
			if err := schema.ValidateName(a.schema); err != nil {
				return fmt.Errorf("--schema: %w", err)
			}
			return nil
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	// The default is read at connect time, not shown as the flag's
	// default: --help must not print a password.
	root.PersistentFlags().StringVar(&a.dsn, "dsn", "", "PostgreSQL connection string (default $DATABASE_URL)")
	root.PersistentFlags().StringVar(&a.schema, "schema", "", "the queue's PostgreSQL schema (default: the connection's current schema)")
	root.AddCommand(
		a.migrateCmd(),
		a.statsCmd(),
		a.groupsCmd(),
		a.groupCmd(),
		a.peekCmd(),
		a.pauseCmd(),
		a.resumeCmd(),
		a.purgeCmd(),
		a.tenantsCmd(),
		a.deadCmd(),
		a.publishCmd(),
		a.metricsCmd(),
		a.serveCmd(),
		a.versionCmd(),
	)
	return root
}

// connect opens the pool (once) and checks that the server answers.
func (a *app) connect(ctx context.Context) (*pgxpool.Pool, error) {
	if a.pool != nil {
		return a.pool, nil
	}
	dsn := a.dsn
	if dsn == "" {
		dsn = a.env.getenv("DATABASE_URL")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, usageErrorf("--dsn: %v", err)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	a.pool = pool
	return pool, nil
}

// transport connects and returns a transport on the queue, after checking
// that its schema is at least the version this command was built with. It
// never applies the schema.
func (a *app) transport(ctx context.Context) (*pgsync.Transport, error) {
	pool, err := a.connect(ctx)
	if err != nil {
		return nil, err
	}
	v, err := a.recordedVersion(ctx)
	if err != nil {
		return nil, err
	}
	switch {
	case v == 0:
		return nil, fmt.Errorf("%w: no pgtransport schema in %s", pgtransport.ErrSchemaMissing, a.schemaLabel())
	case v < schema.Version():
		return nil, fmt.Errorf("schema %s is at version %d, this command needs %d: upgrade it with pgtransport migrate apply", a.schemaLabel(), v, schema.Version())
	}
	return pgsync.New(ctx, pool, pgtransport.Config{Schema: a.schema, SkipApply: true, MaxEventBytes: a.maxEvent})
}

// schemaLabel names the schema for messages.
func (a *app) schemaLabel() string {
	if a.schema == "" {
		return "the current schema"
	}
	return fmt.Sprintf("schema %q", a.schema)
}

// exactArgs is cobra.ExactArgs naming the arguments, as a usage error.
func (a *app) exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return usageErrorf("%s takes %d argument(s) (%s), got %d", cmd.CommandPath(), len(names), strings.Join(names, ", "), len(args))
		}
		if len(names) == 1 && names[0] == "GROUP" {
			a.group = args[0]
		}
		return nil
	}
}
