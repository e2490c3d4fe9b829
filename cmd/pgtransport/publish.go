package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/cmd/pgtransport/internal/show"
)

// publishLine is one line of publish's input.
type publishLine struct {
	Group    *string         `json:"group"`
	Event    json.RawMessage `json:"event"`
	Priority int             `json:"priority"`
	DedupKey string          `json:"dedup_key"`
	Tenant   string          `json:"tenant"`
}

// maxLineBytes bounds one input line: the largest event, escaped, and room.
const maxLineBytes = 64 << 20

// maxReported bounds the bad lines publish names before giving up.
const maxReported = 10

func (a *app) publishCmd() *cobra.Command {
	var (
		asJSON   bool
		batch    int
		maxEvent int
	)
	cmd := &cobra.Command{
		Use:   "publish",
		Short: "Publish messages read from stdin, one JSON object per line",
		Long: `publish reads messages from stdin, one JSON object per line:

  {"group": "order-42", "event": "{\"type\":\"paid\"}", "priority": 0, "dedup_key": "pay-7", "tenant": "acme"}

group and event are required; priority (0-4, default 0) and tenant
(default "default"), both used only by the message that creates its
group, and dedup_key (default none: see pgtransport.Message) are
optional; other fields are refused. event is the
message's text: a JSON string is taken as its value, any other JSON value
(an object, an array, a number) as its compact JSON text, so
{"group":"g","event":{"type":"paid"}} publishes {"type":"paid"}. Blank lines
are skipped. A line whose (group, dedup_key) was published within the
queue's dedup window stores nothing; it is counted among those published,
with the first one's seq.

All of stdin is read and checked before anything is published: a malformed
line anywhere (bad JSON, a missing or unknown field, an invalid group id,
event, priority or dedup key) is reported with its line number, exit 2, and
nothing is published. Then the messages go in input order (so in order
within each group) in batches of --batch, each one transaction. Ctrl-C stops
it between batches (exit 130) and says up to which line the input was
published; a database error does the same (exit 1). A progress bar shows on
a terminal. It prints how many were published (--json: and their seqs, in
input order).`,
		Example: `  echo '{"group":"order-42","event":{"type":"paid"}}' | pgtransport publish
  jq -c '.[] | {group: .id, event: .}' orders.json | pgtransport publish --batch 5000`,
		Args: a.exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkBatch(batch); err != nil {
				return err
			}
			if maxEvent < 1 {
				return usageErrorf("--max-event-bytes %d: want 1 or more", maxEvent)
			}
			msgs, lines, err := readMessages(a.env.stdin, maxEvent)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if ctx.Err() != nil {
				return interruptedErrorf("interrupted while reading stdin: nothing was published")
			}
			a.maxEvent = maxEvent
			tr, err := a.transport(ctx)
			if err != nil {
				return err
			}
			seqs := make([]int64, 0, len(msgs))
			p := a.newProgress(int64(len(msgs)), "publish")
			n, steps, stopped, err := a.batches(ctx, p, func(ctx context.Context) (int64, bool, error) {
				if len(seqs) == len(msgs) {
					return 0, true, nil
				}
				chunk := msgs[len(seqs):min(len(seqs)+batch, len(msgs))]
				s, err := tr.PublishMany(ctx, chunk)
				if err != nil {
					return 0, false, err
				}
				seqs = append(seqs, s...)
				return int64(len(s)), len(seqs) == len(msgs), nil
			})
			p.done()
			upTo := func() string {
				if n == 0 {
					return "nothing was published"
				}
				return fmt.Sprintf("the first %d messages, up to line %d, were published in %d batches; the rest were not", n, lines[n-1], steps)
			}
			if err != nil {
				return fmt.Errorf("%w (%s)", err, upTo())
			}
			if stopped {
				return interruptedErrorf("interrupted: %s", upTo())
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), struct {
					Published int     `json:"published"`
					Seqs      []int64 `json:"seqs"`
				}{len(seqs), seqs})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "published %d messages\n", len(seqs))
			return nil
		},
	}
	cmd.Flags().IntVar(&batch, "batch", 1000, fmt.Sprintf("messages per batch, each one transaction (1 to %d)", pgtransport.MaxBatch))
	cmd.Flags().IntVar(&maxEvent, "max-event-bytes", pgtransport.DefaultMaxEventBytes, "the largest event accepted (as Config.MaxEventBytes)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: {published, seqs}")
	return cmd
}

// readMessages reads and checks all of r. It returns the messages and the
// line number of each, or a usage error naming the bad lines (the first
// maxReported of them).
func readMessages(r io.Reader, maxEvent int) ([]pgtransport.Message, []int, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	var (
		msgs  []pgtransport.Message
		lines []int
		bad   []string
		nbad  int
		line  int
	)
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		m, err := parseLine(text, maxEvent)
		if err != nil {
			nbad++
			if len(bad) < maxReported {
				bad = append(bad, fmt.Sprintf("line %d: %v", line, err))
			}
			continue
		}
		msgs = append(msgs, m)
		lines = append(lines, line)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			err = fmt.Errorf("longer than %d bytes", maxLineBytes)
		}
		return nil, nil, usageErrorf("stdin, line %d: %v; nothing was published", line+1, err)
	}
	if nbad > 0 {
		more := ""
		if nbad > len(bad) {
			more = fmt.Sprintf("\n(and %d more bad lines)", nbad-len(bad))
		}
		return nil, nil, usageErrorf("%d bad input lines; nothing was published:\n%s%s", nbad, strings.Join(bad, "\n"), more)
	}
	return msgs, lines, nil
}

// parseLine parses and checks one line as the transport would: the rules
// of pgtransport.ErrInvalidGroup, ErrInvalidEvent, ErrEventTooLarge,
// ErrInvalidPriority, ErrInvalidDedupKey and ErrInvalidTenant.
func parseLine(text []byte, maxEvent int) (pgtransport.Message, error) {
	if !utf8.Valid(text) {
		return pgtransport.Message{}, errors.New("not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.DisallowUnknownFields()
	var l publishLine
	if err := dec.Decode(&l); err != nil {
		return pgtransport.Message{}, fmt.Errorf("not a JSON object of a message: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return pgtransport.Message{}, errors.New("more than one JSON value on the line")
	}
	m := pgtransport.Message{Priority: l.Priority, DedupKey: l.DedupKey, Tenant: l.Tenant}
	switch {
	case l.Group == nil:
		return m, errors.New(`no "group"`)
	case *l.Group == "", len(*l.Group) > pgtransport.MaxGroupBytes, strings.ContainsRune(*l.Group, 0):
		return m, fmt.Errorf("%w: %q: want 1 to %d bytes without NUL", pgtransport.ErrInvalidGroup, show.Clip(*l.Group, 40), pgtransport.MaxGroupBytes)
	case l.Event == nil || string(l.Event) == "null":
		return m, errors.New(`no "event"`)
	case l.Priority < pgtransport.MinPriority || l.Priority > pgtransport.MaxPriority:
		return m, fmt.Errorf("%w: %d, want %d to %d", pgtransport.ErrInvalidPriority, l.Priority, pgtransport.MinPriority, pgtransport.MaxPriority)
	case len(l.DedupKey) > pgtransport.MaxDedupKeyBytes, strings.ContainsRune(l.DedupKey, 0):
		return m, fmt.Errorf("%w: want at most %d bytes without NUL", pgtransport.ErrInvalidDedupKey, pgtransport.MaxDedupKeyBytes)
	case len(l.Tenant) > pgtransport.MaxTenantBytes, strings.ContainsRune(l.Tenant, 0):
		return m, fmt.Errorf("%w: want at most %d bytes without NUL", pgtransport.ErrInvalidTenant, pgtransport.MaxTenantBytes)
	}
	m.Group = *l.Group
	if l.Event[0] == '"' {
		if err := json.Unmarshal(l.Event, &m.Event); err != nil {
			return m, fmt.Errorf("event: %v", err)
		}
	} else {
		var b bytes.Buffer
		if err := json.Compact(&b, l.Event); err != nil {
			return m, fmt.Errorf("event: %v", err)
		}
		m.Event = b.String()
	}
	switch {
	case strings.ContainsRune(m.Event, 0):
		return m, fmt.Errorf("%w: holds a NUL byte", pgtransport.ErrInvalidEvent)
	case len(m.Event) > maxEvent:
		return m, fmt.Errorf("%w: %d bytes, the limit is %d (--max-event-bytes)", pgtransport.ErrEventTooLarge, len(m.Event), maxEvent)
	}
	return m, nil
}
