package pgtransport_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// TestREADMEFromAScratchModule is a new user's first hour, run: in a
// module of its own outside the repository, it follows the README's
// install steps for a checkout (the replace line, go get, go mod tidy),
// builds a program from the README's "A blocking worker" and "A stream"
// code as printed there (each fragment the body of a function), and runs
// it against a fresh schema: the worker publishes and handles its
// message, the stream receives another, and both stop when their ctx
// ends. A README edit that breaks the code fails it.
func TestREADMEFromAScratchModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module of its own: not in -short")
	}
	t.Parallel()
	is := is.New(t)
	readme, err := os.ReadFile("README.md")
	is.NoErr(err)
	root, err := filepath.Abs(".")
	is.NoErr(err)
	install := codeAfter(t, string(readme), "Until a release is tagged", "```\n")
	worker := codeAfter(t, string(readme), "## A blocking worker", "```go\n")
	stream := codeAfter(t, string(readme), "## A stream", "```go\n")

	dir := t.TempDir()
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("go", "mod", "init", "example.com/newcomer")
	for line := range strings.Lines(install) { // the README's steps, the checkout where it says ../pgtransport
		line, _, _ = strings.Cut(strings.TrimSpace(line), "#")
		fields := strings.Fields(strings.ReplaceAll(line, "../pgtransport", root))
		if len(fields) == 0 || fields[0] != "go" {
			continue // git clone: the checkout is this one
		}
		run(fields[0], fields[1:]...)
	}
	wImports, wBody := splitImports(worker)
	sImports, sBody := splitImports(stream)
	program := `package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
` + wImports + sImports + `)

var _ = time.Second

// blockingWorker is the README's "A blocking worker", as printed there.
func blockingWorker(ctx context.Context, executionID string, handle func(context.Context, string, string) error) error {
` + wBody + `
}

// streamConsumer is the README's "A stream", as printed there.
func streamConsumer(ctx context.Context, handle func(context.Context, string, string) error) error {
` + sBody + `
}

func main() {
	ctx := context.Background()
	wctx, stopWorker := context.WithCancel(ctx)
	err := blockingWorker(wctx, "execution-1", func(_ context.Context, group, event string) error {
		fmt.Println("worker handled:", group, event)
		stopWorker() // a graceful shutdown: the handler's result is still settled
		return nil
	})
	fmt.Println("worker stopped:", err)

	tr, err := pgsync.FromDSN(ctx, os.Getenv("DATABASE_URL"), pgtransport.Config{})
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	if _, err := tr.Publish(ctx, "execution-2", "second", 0); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	tr.Close()
	sctx, stopStream := context.WithCancel(ctx)
	err = streamConsumer(sctx, func(_ context.Context, group, event string) error {
		fmt.Println("stream handled:", group, event)
		stopStream()
		return nil
	})
	fmt.Println("stream stopped:", errors.Is(err, context.Canceled))
}
`
	is.NoErr(os.WriteFile(filepath.Join(dir, "main.go"), []byte(program), 0o644))
	run("go", "mod", "tidy")
	run("go", "build", "-o", "newcomer", ".") // built first: a loaded machine's compile is not the run's minute
	db := pgtest.New(t, 2)
	cmd := exec.CommandContext(pgtest.Context(t), filepath.Join(dir, "newcomer"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db.DSN+" search_path="+db.Schema)
	if strings.Contains(db.DSN, "://") {
		sep := "?"
		if strings.Contains(db.DSN, "?") {
			sep = "&"
		}
		cmd.Env[len(cmd.Env)-1] = "DATABASE_URL=" + db.DSN + sep + "search_path=" + db.Schema
	}
	out, err := cmd.CombinedOutput()
	t.Logf("the newcomer's program:\n%s", out)
	is.NoErr(err)                                                                            // it runs
	is.True(strings.Contains(string(out), `worker handled: execution-1 {"type":"started"}`)) // the worker published and handled
	is.True(strings.Contains(string(out), "worker stopped: <nil>"))                          // and shut down gracefully
	is.True(strings.Contains(string(out), "stream handled: execution-2 second"))             // the stream received
	is.True(strings.Contains(string(out), "stream stopped: true"))                           // and stopped with its ctx
}

// codeAfter is the first code block of doc after heading that opens
// with fence.
func codeAfter(t *testing.T, doc, heading, fence string) string {
	t.Helper()
	i := strings.Index(doc, heading)
	if i < 0 {
		t.Fatalf("README: no %q", heading)
	}
	j := strings.Index(doc[i:], fence)
	if j < 0 {
		t.Fatalf("README: no code after %q", heading)
	}
	body := doc[i+j+len(fence):]
	return body[:strings.Index(body, "```")]
}

// splitImports takes a fragment's import lines out: the import paths
// (each on a line of its own, for the program's import block) and the
// rest.
func splitImports(fragment string) (imports, body string) {
	block := regexp.MustCompile(`(?s)^\s*import \((.*?)\)\n`)
	single := regexp.MustCompile(`^\s*import (\S+)\n`)
	if m := block.FindStringSubmatch(fragment); m != nil {
		return m[1], fragment[len(m[0]):]
	}
	if m := single.FindStringSubmatch(fragment); m != nil {
		return "\t" + m[1] + "\n", fragment[len(m[0]):]
	}
	return "", fragment
}
