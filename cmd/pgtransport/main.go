// Command pgtransport operates a pgtransport queue from a shell: apply and
// inspect the schema, see the queue's depth and its groups, look at a
// group's next messages, pause, resume or purge a group, list, redrive or
// purge dead letters, publish messages from a script, serve
// OpenTelemetry metrics as Prometheus text, serve a live dashboard in the
// browser, and print the versions it was built from (`pgtransport version`:
// the command's, the library's and metrics' modules, and its schema version).
//
// It is a module of its own, so its dependencies (cobra, OpenTelemetry,
// Prometheus) never reach the library's go.mod. Install it from a checkout
// with
//
//	cd cmd/pgtransport && go install .
//
// and, once the modules are tagged, with
//
//	go install github.com/pgtransport/pgtransport/cmd/pgtransport@latest
//
// (go install @version refuses a go.mod with replace directives: a tagged
// release requires the tagged library and metrics modules instead of the
// checkout's replace lines; docs/release.md has the steps).
//
// It connects to --dsn (default $DATABASE_URL; empty: libpq's defaults,
// the PG* variables and the local socket) and works on the queue in
// --schema (default: the connection's current schema). Every command but
// `migrate` refuses a schema older than the one it was built with, and
// never applies or changes the schema itself.
//
// # Output
//
// Tables are for people; --json prints the same data for scripts (one
// JSON document on stdout). Messages about progress and errors go to
// stderr. A long operation (purge, dead redrive, dead purge, publish)
// shows a progress bar when stderr is a terminal and prints nothing but
// its result when it is not.
//
// # Batches and Ctrl-C
//
// Long operations work in batches, each one transaction. Ctrl-C (SIGINT)
// stops them between batches: the batch in flight finishes whole, the
// command prints how far it got and exits 130; nothing is ever half done.
// A second Ctrl-C kills the process at once; the database then rolls back
// the batch in flight, so even then only whole batches are done.
//
// Destructive commands (purge, dead purge) ask for confirmation when
// stdin is a terminal, and require --yes when it is not.
//
// # Exit codes
//
//	0    success
//	1    the operation failed: database or connection error, schema missing
//	     or too old, or a confirmation declined
//	2    usage or bad input: unknown command or flag, bad flag value, bad
//	     schema name, invalid group id, malformed stdin; nothing was written
//	3    not found: the group has no row (never published to, or drained)
//	130  interrupted (Ctrl-C): whole batches only were done, as reported
//
// `metrics` and `serve` are servers: Ctrl-C is their normal stop, and they
// exit 0.
package main

import (
	"context"
	"os"
	"os/signal"

	"golang.org/x/term"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	// After the first Ctrl-C, restore the default: a second one kills the
	// process (the database rolls back the batch in flight).
	context.AfterFunc(ctx, stop)
	e := &env{
		stdin:     os.Stdin,
		stdout:    os.Stdout,
		stderr:    os.Stderr,
		getenv:    os.Getenv,
		stdinTTY:  term.IsTerminal(int(os.Stdin.Fd())),
		stderrTTY: term.IsTerminal(int(os.Stderr.Fd())),
	}
	code := run(ctx, os.Args[1:], e)
	stop()
	os.Exit(code)
}
