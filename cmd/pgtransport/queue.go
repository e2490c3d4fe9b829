package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/cmd/pgtransport/internal/purge"
	"github.com/pgtransport/pgtransport/cmd/pgtransport/internal/show"
)

// JSON shapes. Durations are seconds; times RFC 3339 in UTC by the
// database server's clock, null when unknown.

type statsJSON struct {
	At         time.Time            `json:"at"`
	Waiting    int64                `json:"waiting"`
	Total      show.PriorityStats   `json:"total"`
	ByPriority []show.PriorityStats `json:"by_priority"`
}

type groupJSON struct {
	Group    string     `json:"group"`
	Priority int        `json:"priority"`
	State    string     `json:"state"`
	Holder   string     `json:"holder"`
	LeasedAt *time.Time `json:"leased_at"`
	Until    *time.Time `json:"until"`
	HeadSeq  int64      `json:"head_seq"`
	HeadAge  float64    `json:"head_age_seconds"`
	Attempts int        `json:"attempts"`
	Tenant   string     `json:"tenant"`
}

func toGroupJSON(g pgtransport.GroupInfo) groupJSON {
	return groupJSON{
		Group: g.Group, Priority: g.Priority, State: string(g.State), Holder: g.Holder,
		LeasedAt: timeOrNil(g.LeasedAt), Until: timeOrNil(g.Until),
		HeadSeq: g.HeadSeq, HeadAge: seconds(g.HeadAge), Attempts: g.Attempts, Tenant: g.Tenant,
	}
}

type peekJSON struct {
	Seq         int64      `json:"seq"`
	Event       string     `json:"event"`
	PublishedAt *time.Time `json:"published_at"`
	LastError   string     `json:"last_error"`
}

func (a *app) statsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show the queue at a glance: groups by state, messages, oldest head, dead letters",
		Long: `stats shows, per priority and in total, the groups in each state (free,
leased, parked, stopped, paused), the messages queued, the age of the oldest
message waiting at a group's head, the dead letters, and the idle consumers
waiting. One round-trip, cheap enough to poll. Leased, parked, stopped and
paused groups are exact; a count marked ~ is an estimate (past 100,000 rows,
from a sample of the table), and an oldest-head age marked ~ is an upper
bound.`,
		Args: a.exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			tr, err := a.transport(ctx)
			if err != nil {
				return err
			}
			s, err := tr.Stats(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				out := statsJSON{At: s.At.UTC(), Waiting: s.Waiting, Total: show.Priority(s.Total), ByPriority: []show.PriorityStats{}}
				for _, p := range s.ByPriority {
					out.ByPriority = append(out.ByPriority, show.Priority(p))
				}
				return writeJSON(cmd.OutOrStdout(), out)
			}
			return writeStats(cmd.OutOrStdout(), s)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func writeStats(w io.Writer, s pgtransport.Stats) error {
	t := newTable(w, "PRIORITY", "GROUPS", "FREE", "LEASED", "PARKED", "STOPPED", "PAUSED", "MESSAGES", "OLDEST HEAD", "DEAD LETTERS")
	line := func(name string, p pgtransport.PriorityStats) {
		oldest := show.Age(p.OldestHeadAge)
		if !p.OldestHeadExact && oldest != "-" {
			oldest = "~" + oldest
		}
		t.row(name, count(p.Groups, p.GroupsExact), count(p.Free, p.GroupsExact), fmt.Sprint(p.Leased), fmt.Sprint(p.Parked),
			fmt.Sprint(p.Stopped), fmt.Sprint(p.Paused), count(p.Messages, p.MessagesExact), oldest,
			count(p.DeadLetters, p.DeadLettersExact))
	}
	for _, p := range s.ByPriority {
		line(fmt.Sprint(p.Priority), p)
	}
	line("all", s.Total)
	if err := t.flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\n%d idle streams waiting for a notification (blocking workers not counted). Read at %s (server clock); ~ marks an estimate.\n",
		s.Waiting, s.At.UTC().Format(time.RFC3339))
	return err
}

var (
	groupStates = []pgtransport.GroupState{pgtransport.GroupFree, pgtransport.GroupLeased, pgtransport.GroupParked, pgtransport.GroupStopped, pgtransport.GroupPaused}
	groupOrders = []pgtransport.GroupOrder{pgtransport.ByGroup, pgtransport.OldestHead, pgtransport.HeldLongest, pgtransport.MostAttempts}
)

func (a *app) groupsCmd() *cobra.Command {
	var (
		asJSON       bool
		state, order string
		q            pgtransport.GroupQuery
	)
	cmd := &cobra.Command{
		Use:   "groups",
		Short: "List groups with their state, holder, head, attempts and tenant",
		Long: `groups lists a page of the queue's groups: state, holder (lease token), how
long the holder has held it, when its lease, park or backoff ends, its head
message's seq and age, the head's attempts so far, and the group's tenant.

--state: free, leased, parked, stopped or paused (default: all).
--tenant: only that tenant's groups (default: every tenant's).
--order: group (by id, the default), oldest_head (oldest head first),
held_longest (leased groups, longest-held first), most_attempts (heads
handed out more than once, most first).
Page on with --offset grown by the rows seen.`,
		Example: `  pgtransport groups --order oldest_head --limit 20
  pgtransport groups --state parked --order most_attempts
  pgtransport groups --tenant acme --state leased
  pgtransport groups --order held_longest --json | jq -r '.[].holder'`,
		Args: a.exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			q.State, q.Order = pgtransport.GroupState(state), pgtransport.GroupOrder(order)
			if q.State != "" && !slices.Contains(groupStates, q.State) {
				return usageErrorf("--state %q: want one of %v", state, groupStates)
			}
			if !slices.Contains(groupOrders, q.Order) {
				return usageErrorf("--order %q: want one of %v", order, groupOrders)
			}
			if q.Limit < 1 || q.Limit > pgtransport.MaxBatch {
				return usageErrorf("--limit %d: want 1 to %d", q.Limit, pgtransport.MaxBatch)
			}
			if q.Offset < 0 {
				return usageErrorf("--offset %d: want 0 or more", q.Offset)
			}
			ctx := cmd.Context()
			tr, err := a.transport(ctx)
			if err != nil {
				return err
			}
			gs, err := tr.Groups(ctx, q)
			if err != nil {
				return err
			}
			if asJSON {
				out := []groupJSON{}
				for _, g := range gs {
					out = append(out, toGroupJSON(g))
				}
				return writeJSON(cmd.OutOrStdout(), out)
			}
			now, err := a.serverNow(ctx)
			if err != nil {
				return err
			}
			t := newTable(cmd.OutOrStdout(), "GROUP", "PRIORITY", "STATE", "HOLDER", "HELD FOR", "ENDS IN", "HEAD", "HEAD AGE", "ATTEMPTS", "TENANT")
			for _, g := range gs {
				t.row(show.Clip(g.Group, 40), fmt.Sprint(g.Priority), string(g.State), show.Clip(g.Holder, 48),
					since(now, g.LeasedAt), until(now, g.Until), seq(g.HeadSeq), show.Age(g.HeadAge), fmt.Sprint(g.Attempts),
					show.Clip(g.Tenant, 32))
			}
			if err := t.flush(); err != nil {
				return err
			}
			if len(gs) == q.Limit {
				fmt.Fprintf(a.env.stderr, "(more may follow: --offset %d)\n", q.Offset+len(gs))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "only groups in this state: free, leased, parked, stopped, paused")
	cmd.Flags().StringVar(&q.Tenant, "tenant", "", "only groups of this tenant")
	cmd.Flags().StringVar(&order, "order", string(pgtransport.ByGroup), "order: group, oldest_head, held_longest, most_attempts")
	cmd.Flags().IntVar(&q.Limit, "limit", pgtransport.DefaultGroupLimit, fmt.Sprintf("page size (1 to %d)", pgtransport.MaxBatch))
	cmd.Flags().IntVar(&q.Offset, "offset", 0, "rows to skip")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: an array of groups")
	return cmd
}

func (a *app) groupCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "group GROUP",
		Short: "Show one group",
		Long:  `group shows one group as groups lists it. Exit 3 if the group has no row (never published to, or drained).`,
		Args:  a.exactArgs("GROUP"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			tr, err := a.transport(ctx)
			if err != nil {
				return err
			}
			g, err := tr.Group(ctx, args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), toGroupJSON(g))
			}
			now, err := a.serverNow(ctx)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "group:     %s\n", g.Group)
			fmt.Fprintf(w, "priority:  %d\n", g.Priority)
			fmt.Fprintf(w, "state:     %s\n", g.State)
			fmt.Fprintf(w, "holder:    %s\n", or(g.Holder, "-"))
			fmt.Fprintf(w, "held for:  %s\n", since(now, g.LeasedAt))
			fmt.Fprintf(w, "ends in:   %s\n", until(now, g.Until))
			fmt.Fprintf(w, "head seq:  %s\n", seq(g.HeadSeq))
			fmt.Fprintf(w, "head age:  %s\n", show.Age(g.HeadAge))
			fmt.Fprintf(w, "attempts:  %d\n", g.Attempts)
			fmt.Fprintf(w, "tenant:    %s\n", or(g.Tenant, "-"))
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (a *app) peekCmd() *cobra.Command {
	var (
		asJSON bool
		n      int
	)
	cmd := &cobra.Command{
		Use:   "peek GROUP",
		Short: "Show a group's next messages without leasing them",
		Long: `peek shows the group's next -n messages, head first, without leasing them:
nothing changes. The table cuts events to one short line; --json prints them
whole. Exit 3 if the group has no row and no message.`,
		Args: a.exactArgs("GROUP"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 1 || n > pgtransport.MaxBatch {
				return usageErrorf("-n %d: want 1 to %d", n, pgtransport.MaxBatch)
			}
			ctx := cmd.Context()
			tr, err := a.transport(ctx)
			if err != nil {
				return err
			}
			ms, err := tr.Peek(ctx, args[0], n)
			if err != nil {
				return err
			}
			if asJSON {
				out := []peekJSON{}
				for _, m := range ms {
					out = append(out, peekJSON{m.Seq, m.Event, timeOrNil(m.PublishedAt), m.LastError})
				}
				return writeJSON(cmd.OutOrStdout(), out)
			}
			now, err := a.serverNow(ctx)
			if err != nil {
				return err
			}
			t := newTable(cmd.OutOrStdout(), "SEQ", "AGE", "LAST ERROR", "EVENT")
			for _, m := range ms {
				t.row(fmt.Sprint(m.Seq), since(now, m.PublishedAt), show.Clip(m.LastError, 40), show.Clip(m.Event, 60))
			}
			return t.flush()
		},
	}
	cmd.Flags().IntVarP(&n, "n", "n", 10, fmt.Sprintf("how many messages (1 to %d)", pgtransport.MaxBatch))
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: an array of messages, events whole")
	return cmd
}

func (a *app) pauseCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "pause GROUP",
		Short: "Pause a group: no consumer claims it until resume",
		Long: `pause stops every consumer (plain SQL ones too) from claiming the group until
resume. It keeps its messages and its place; a holder mid-message may still
finish it. Pausing a paused group changes nothing. Exit 3 if the group has no
row.`,
		Args: a.exactArgs("GROUP"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			tr, err := a.transport(ctx)
			if err != nil {
				return err
			}
			if err := tr.PauseGroup(ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "group %q is paused\n", args[0])
			return nil
		},
	}
}

func (a *app) resumeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "resume GROUP",
		Short: "Resume a paused group",
		Long: `resume puts a paused group back into the round-robin, its messages in their
order, and wakes idle consumers. Resuming a group that is not paused changes
nothing. Exit 3 if the group has no row.`,
		Args: a.exactArgs("GROUP"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			tr, err := a.transport(ctx)
			if err != nil {
				return err
			}
			if err := tr.ResumeGroup(ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "group %q is resumed\n", args[0])
			return nil
		},
	}
}

func (a *app) purgeCmd() *cobra.Command {
	var (
		yes, asJSON bool
		batch       int
	)
	cmd := &cobra.Command{
		Use:   "purge GROUP",
		Short: "Delete every message of a group",
		Long: `purge deletes the group's messages for good, oldest first, in batches of
--batch, each one transaction. It ends any lease, park or stop on the group:
a worker handling its head gets ErrLeaseLost when it settles. The group is
paused while it runs, so no worker takes it between two batches, and
resumed at the end (a group that was paused stays paused). Messages
published after the last batch are kept.

On a terminal it asks for confirmation unless --yes; otherwise --yes is
required. Ctrl-C stops it between batches (exit 130). Exit 3 if the group
has no row.`,
		Args: a.exactArgs("GROUP"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkBatch(batch); err != nil {
				return err
			}
			group := args[0]
			ctx := cmd.Context()
			tr, err := a.transport(ctx)
			if err != nil {
				return err
			}
			g, err := tr.Group(ctx, group)
			if err != nil {
				return err
			}
			if err := a.confirm(yes, fmt.Sprintf("Delete every message of group %q (%s, head seq %s)?", group, g.State, seq(g.HeadSeq))); err != nil {
				return err
			}
			p := a.newProgress(-1, "purge")
			var (
				total   int64
				steps   int
				stopped bool
			)
			err = purge.Paused(ctx, tr, group, func() (err error) {
				total, steps, stopped, err = a.batches(ctx, p, func(ctx context.Context) (int64, bool, error) {
					return purge.Batch(ctx, tr, group, batch)
				})
				return err
			})
			p.done()
			if err != nil {
				return fmt.Errorf("%w (%d messages were purged in %d batches before it)", err, total, steps)
			}
			if stopped {
				return interruptedErrorf("interrupted: purged %d messages of group %q in %d batches; the rest are untouched", total, group, steps)
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), struct {
					Group  string `json:"group"`
					Purged int64  `json:"purged"`
				}{group, total})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "purged %d messages of group %q\n", total, group)
			return nil
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: {group, purged}")
	batchFlag(cmd, &batch, pgtransport.MaxBatch)
	return cmd
}

// serverNow is the database server's clock, against which the times of
// Groups and Peek are shown.
func (a *app) serverNow(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := a.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("read the server's clock: %w", err)
	}
	return now, nil
}

// since is how long ago t was, "-" for the zero time.
func since(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return show.Age(now.Sub(t))
}

// until is how long until t, "-" for the zero time or one passed.
func until(now, t time.Time) string {
	if t.IsZero() || !t.After(now) {
		return "-"
	}
	return show.Age(t.Sub(now))
}

func seq(s int64) string {
	if s == 0 {
		return "-"
	}
	return fmt.Sprint(s)
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
