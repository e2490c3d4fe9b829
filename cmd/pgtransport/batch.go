package main

import (
	"context"
	"fmt"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/pgtransport/pgtransport"
)

// progress draws a bar on stderr when it is a terminal, and nothing
// otherwise.
type progress struct {
	bar *progressbar.ProgressBar // nil: not a terminal
}

// newProgress starts a bar of total units (-1: unknown, a spinner with a
// count).
func (a *app) newProgress(total int64, what string) *progress {
	if !a.env.stderrTTY {
		return &progress{}
	}
	return &progress{progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(a.env.stderr),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("msg"),
		progressbar.OptionThrottle(100*time.Millisecond),
		// No ticker goroutine for a spinner: it turns as batches land, and
		// nothing outlives the command.
		progressbar.OptionSetSpinnerChangeInterval(0),
		progressbar.OptionSetWidth(30),
		progressbar.OptionFullWidth(),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(a.env.stderr) }),
	)}
}

func (p *progress) add(n int64) {
	if p.bar != nil {
		_ = p.bar.Add64(n)
	}
}

// done ends the bar's line, so what follows starts on a line of its own.
func (p *progress) done() {
	if p.bar != nil && !p.bar.IsFinished() {
		_ = p.bar.Exit() // keeps the bar as drawn and ends its line
	}
}

// batches calls step until it reports done, one batch at a time. Each
// step runs to its end even if ctx is cancelled meanwhile (a batch is one
// transaction: it commits whole or not at all); between steps, a
// cancelled ctx stops the loop with interrupted true. It returns the sum
// of the steps' counts and how many steps ran.
func (a *app) batches(ctx context.Context, p *progress, step func(ctx context.Context) (n int64, done bool, err error)) (total int64, steps int, interrupted bool, err error) {
	whole := context.WithoutCancel(ctx)
	for {
		if ctx.Err() != nil {
			return total, steps, true, nil
		}
		if a.env.beforeBatch != nil {
			a.env.beforeBatch(steps + 1)
		}
		n, done, err := step(whole)
		if err != nil {
			return total, steps, false, err
		}
		steps++
		total += n
		p.add(n)
		if done {
			return total, steps, false, nil
		}
	}
}

// batchFlag adds --batch, the size of one batch (one transaction).
func batchFlag(cmd *cobra.Command, v *int, def int) {
	cmd.Flags().IntVar(v, "batch", def, fmt.Sprintf("how many per batch, each one transaction (1 to %d)", pgtransport.MaxBatch))
}

func checkBatch(n int) error {
	if n < 1 || n > pgtransport.MaxBatch {
		return usageErrorf("--batch %d: want 1 to %d", n, pgtransport.MaxBatch)
	}
	return nil
}

// confirm asks question on the terminal, or requires --yes when stdin is
// not a terminal. It returns nil to go ahead.
func (a *app) confirm(yes bool, question string) error {
	if yes {
		return nil
	}
	if !a.env.stdinTTY {
		return usageErrorf("%s: stdin is not a terminal, so pass --yes to confirm; nothing was changed", question)
	}
	fmt.Fprintf(a.env.stderr, "%s This cannot be undone. [y/N] ", question)
	var answer string
	_, _ = fmt.Fscanln(a.env.stdin, &answer)
	switch answer {
	case "y", "Y", "yes", "YES", "Yes":
		return nil
	}
	return &exitError{exitFailed, fmt.Errorf("not confirmed; nothing was changed")}
}
