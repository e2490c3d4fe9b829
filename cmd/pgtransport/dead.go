package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/cmd/pgtransport/internal/show"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

type deadJSON struct {
	Seq         int64      `json:"seq"`
	Group       string     `json:"group"`
	Priority    int        `json:"priority"`
	Attempts    int        `json:"attempts"`
	LastError   string     `json:"last_error"`
	PublishedAt *time.Time `json:"published_at"`
	DiedAt      time.Time  `json:"died_at"`
	Event       string     `json:"event"`
}

func (a *app) deadCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dead",
		Short: "List, redrive or purge dead letters",
		Long: `dead handles the dead letters: messages that used their attempts and were
moved out of their groups.

  dead list     list them, a page at a time
  dead redrive  put them back at the head of their groups, in their order
  dead purge    delete them for good`,
		Args: a.exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.deadListCmd(), a.deadActCmd(true), a.deadActCmd(false))
	return cmd
}

func (a *app) deadListCmd() *cobra.Command {
	var (
		asJSON bool
		q      pgtransport.DeadLetterQuery
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, in seq order",
		Long: `list shows a page of dead letters in seq order: those of --group (default:
every group) after --after, at most --limit. Page on with --after set to the
last seq shown. The table cuts events and errors to one short line; --json
prints them whole.`,
		Example: `  pgtransport dead list --group order-42
  pgtransport dead list --after 1500 --limit 1000 --json`,
		Args: a.exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			if q.Limit < 1 || q.Limit > pgtransport.MaxBatch {
				return usageErrorf("--limit %d: want 1 to %d", q.Limit, pgtransport.MaxBatch)
			}
			if q.After < 0 {
				return usageErrorf("--after %d: want 0 or more", q.After)
			}
			ctx := cmd.Context()
			tr, err := a.transport(ctx)
			if err != nil {
				return err
			}
			ds, err := tr.DeadLetters(ctx, q)
			if err != nil {
				return err
			}
			if asJSON {
				out := []deadJSON{}
				for _, d := range ds {
					out = append(out, deadJSON{d.Seq, d.Group, d.Priority, d.Attempts, d.LastError, timeOrNil(d.PublishedAt), d.DiedAt.UTC(), d.Event})
				}
				return writeJSON(cmd.OutOrStdout(), out)
			}
			now, err := a.serverNow(ctx)
			if err != nil {
				return err
			}
			t := newTable(cmd.OutOrStdout(), "SEQ", "GROUP", "PRIORITY", "ATTEMPTS", "DIED", "LAST ERROR", "EVENT")
			for _, d := range ds {
				t.row(fmt.Sprint(d.Seq), show.Clip(d.Group, 40), fmt.Sprint(d.Priority), fmt.Sprint(d.Attempts),
					since(now, d.DiedAt)+" ago", show.Clip(d.LastError, 40), show.Clip(d.Event, 50))
			}
			if err := t.flush(); err != nil {
				return err
			}
			if len(ds) == q.Limit {
				fmt.Fprintf(a.env.stderr, "(more may follow: --after %d)\n", ds[len(ds)-1].Seq)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&q.Group, "group", "", "only this group's dead letters")
	cmd.Flags().Int64Var(&q.After, "after", 0, "only seqs after this one (the last seq of the previous page)")
	cmd.Flags().IntVar(&q.Limit, "limit", pgtransport.DefaultDeadLetterLimit, fmt.Sprintf("page size (1 to %d)", pgtransport.MaxBatch))
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: an array of dead letters, whole")
	return cmd
}

// deadActCmd is dead redrive (redrive true) or dead purge.
func (a *app) deadActCmd(redrive bool) *cobra.Command {
	var (
		yes, asJSON bool
		group       string
		seqs        []int64
		batch       int
	)
	verb, done := "purge", "purged"
	if redrive {
		verb, done = "redrive", "redriven"
	}
	cmd := &cobra.Command{
		Use:  verb,
		Args: a.exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkBatch(batch); err != nil {
				return err
			}
			if slices.ContainsFunc(seqs, func(s int64) bool { return s <= 0 }) {
				return usageErrorf("--seq: seqs are positive")
			}
			ctx := cmd.Context()
			tr, err := a.transport(ctx)
			if err != nil {
				return err
			}
			if group != "" {
				// Refuse a bad group id before asking anything.
				if _, err := tr.DeadLetters(ctx, pgtransport.DeadLetterQuery{Group: group, Limit: 1}); err != nil {
					return err
				}
			}
			if !redrive {
				what := "every dead letter"
				switch {
				case len(seqs) > 0 && group != "":
					what = fmt.Sprintf("the dead letters of group %q with the %d seqs given", group, len(seqs))
				case len(seqs) > 0:
					what = fmt.Sprintf("the dead letters with the %d seqs given", len(seqs))
				case group != "":
					what = fmt.Sprintf("every dead letter of group %q", group)
				}
				if err := a.confirm(yes, fmt.Sprintf("Delete %s?", what)); err != nil {
					return err
				}
			}
			act := tr.PurgeDeadLetters
			if redrive {
				act = tr.Redrive
			}
			total := int64(-1)
			if seqs != nil {
				total = int64(len(seqs))
			}
			p := a.newProgress(total, verb)
			n, steps, stopped, err := a.batches(ctx, p, deadBatches(tr, act, group, seqs, batch))
			p.done()
			if err != nil {
				return fmt.Errorf("%w (%d were %s in %d batches before it)", err, n, done, steps)
			}
			if stopped {
				return interruptedErrorf("interrupted: %d dead letters %s in %d batches; the rest are untouched (run it again to go on)", n, done, steps)
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), map[string]int64{done: n})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %d dead letters\n", done, n)
			return nil
		},
	}
	if redrive {
		cmd.Short = "Put dead letters back at the head of their groups"
		cmd.Long = `redrive puts the dead letters back into their groups, each at the head of its
group with its own seq, so in their original order and ahead of messages
published after them; each starts again with fresh attempts. Those of
--group (default: every group), and with --seq only those seqs (repeat it,
or give a comma-separated list).

It works in batches of --batch, each one transaction: it lists a batch of
seqs, then redrives them. Ctrl-C stops it between batches (exit 130); run it
again to go on. A progress bar shows on a terminal.`
		cmd.Example = `  pgtransport dead redrive --group order-42
  pgtransport dead redrive --seq 1501,1502 --seq 1600`
	} else {
		cmd.Short = "Delete dead letters for good"
		cmd.Long = `purge deletes dead letters for good: those of --group (default: every group),
and with --seq only those seqs (repeat it, or give a comma-separated list).

It works in batches of --batch, each one transaction. On a terminal it asks
for confirmation unless --yes; otherwise --yes is required. Ctrl-C stops it
between batches (exit 130). A progress bar shows on a terminal.`
		cmd.Example = `  pgtransport dead purge --group order-42 --yes`
		cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	}
	cmd.Flags().StringVar(&group, "group", "", "only this group's dead letters")
	cmd.Flags().Int64SliceVar(&seqs, "seq", nil, "only these seqs (repeatable, or comma-separated)")
	cmd.Flags().BoolVar(&asJSON, "json", false, fmt.Sprintf("print JSON: {%q: N}", done))
	batchFlag(cmd, &batch, 1000)
	return cmd
}

// deadBatches returns the batch step of dead redrive or purge: the next
// batch of seqs given, or else the next page of dead letters listed after
// the last one done, acted on by seq.
func deadBatches(tr *pgsync.Transport, act func(context.Context, pgtransport.DeadLetterFilter) (int64, error), group string, seqs []int64, batch int) func(context.Context) (int64, bool, error) {
	var after int64
	return func(ctx context.Context) (int64, bool, error) {
		var page []int64
		if seqs != nil {
			page = seqs[:min(batch, len(seqs))]
			seqs = seqs[len(page):]
		} else {
			ds, err := tr.DeadLetters(ctx, pgtransport.DeadLetterQuery{Group: group, After: after, Limit: batch})
			if err != nil {
				return 0, false, err
			}
			for _, d := range ds {
				page = append(page, d.Seq)
			}
			if len(ds) > 0 {
				after = ds[len(ds)-1].Seq
			}
		}
		if len(page) == 0 {
			return 0, true, nil
		}
		n, err := act(ctx, pgtransport.DeadLetterFilter{Group: group, Seqs: page})
		last := len(page) < batch || (seqs != nil && len(seqs) == 0)
		return n, last, err
	}
}
