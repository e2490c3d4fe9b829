package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/schema"
)

// TestOperatingSession replays the session docs/operating.md shows, on a
// fresh schema, so that it cannot go stale: the migrate line names this
// schema version; every table's header, every one-line answer and the
// exit code of the failing command are the command's own; the stats
// footer has the command's words. (The rows depend on a worker the doc
// ran beside it; their shape is the golden tests'.)
func TestOperatingSession(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	doc, err := os.ReadFile("../../docs/operating.md")
	is.NoErr(err)
	block := sessionBlock(t, string(doc))
	h := newHarness(t, false)
	var orders strings.Builder
	for i := range 40 {
		fmt.Fprintf(&orders, `{"group":"order-%d","event":"{\"type\":\"paid\",\"n\":%d}"}`+"\n", i%8, i)
	}
	digits := regexp.MustCompile(`[0-9]+`)
	stamp := regexp.MustCompile(`[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]+Z`)
	for _, c := range block {
		args := strings.Fields(c.cmd)
		var code int
		if i := strings.Index(c.cmd, ";"); i >= 0 { // `cmd; echo "exit $?"`: the last line is the exit code
			args = strings.Fields(c.cmd[:i])
			_, err := fmt.Sscanf(c.out[len(c.out)-1], "exit %d", &code)
			is.NoErr(err) // the doc shows the exit code
			c.out = c.out[:len(c.out)-1]
		}
		for k := 0; k < len(args); k++ { // the doc's schema is the harness's
			if args[k] == "--schema" {
				args = append(args[:k], args[k+2:]...)
				k--
			} else if args[k] == "<" {
				args = args[:k]
			}
		}
		stdin := ""
		if strings.Contains(c.cmd, "< orders.jsonl") {
			stdin = orders.String()
		}
		r := h.run(stdin, args[1:]...)
		is.Equal(r.code, code) // the exit code the doc shows
		got := strings.Split(strings.TrimRight(r.stdout+r.stderr, "\n"), "\n")
		want := c.out
		switch {
		case args[1] == "migrate":
			is.Equal(want[0], fmt.Sprintf("schema %q upgraded from version 0 to %d", "shop", schema.Version())) // the doc's version is today's
			is.Equal(got[0], fmt.Sprintf("schema %q upgraded from version 0 to %d", h.schema, schema.Version()))
		case len(want) == 1: // a one-line answer, word for word
			is.Equal(strings.ReplaceAll(got[0], h.schema, "shop"), want[0])
		default: // a table: its header, and for stats its footer's words
			is.Equal(strings.Join(strings.Fields(got[0]), " "), strings.Join(strings.Fields(want[0]), " "))
			if args[1] == "stats" {
				norm := func(s string) string { return digits.ReplaceAllString(stamp.ReplaceAllString(s, "T"), "N") }
				is.Equal(norm(got[len(got)-1]), norm(want[len(want)-1]))
			}
		}
	}
}

// sessionCommand is one command of the doc's session and what it printed.
type sessionCommand struct {
	cmd string
	out []string
}

// sessionBlock is the code block of doc that starts with "$ pgtransport
// migrate apply", command by command.
func sessionBlock(t *testing.T, doc string) []sessionCommand {
	t.Helper()
	start := strings.Index(doc, "```\n$ pgtransport migrate apply")
	if start < 0 {
		t.Fatal("docs/operating.md: no session block")
	}
	body := doc[start+4:]
	body = body[:strings.Index(body, "```")]
	var cmds []sessionCommand
	for line := range strings.Lines(body) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, "$ ") {
			cmd, _, _ := strings.Cut(line[2:], "  #") // a comment after the command
			cmds = append(cmds, sessionCommand{cmd: strings.TrimSpace(cmd)})
			continue
		}
		if line != "" && len(cmds) > 0 {
			cmds[len(cmds)-1].out = append(cmds[len(cmds)-1].out, line)
		}
	}
	return cmds
}
