package core

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestWakeCounts pins the wake-up policy (wake.go): how many parked callers
// each operation wakes, run against PostgreSQL so the count is the one the
// operation really gives. Each case has a queue of its own.
func TestWakeCounts(t *testing.T) {
	t.Parallel()
	// Each setup prepares its case (through c, before anyone parks) and
	// returns the operation whose wake-ups are counted.
	type op func(ctx context.Context) error
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, c *Core, group string) op
		want  int
	}{
		{"publish", func(t *testing.T, c *Core, g string) op {
			return func(ctx context.Context) error { _, err := c.Publish(ctx, g, "e", 0); return err }
		}, 1},
		{"publish refused", func(t *testing.T, c *Core, g string) op {
			return func(ctx context.Context) error {
				_, err := c.Publish(ctx, "", "e", 0)
				return wantErr(err, pgtransport.ErrInvalidGroup)
			}
		}, 0},
		{"publish many", func(t *testing.T, c *Core, g string) op {
			return func(ctx context.Context) error {
				_, err := c.PublishMany(ctx, []pgtransport.Message{{Group: g + "a", Event: "e"}, {Group: g + "b", Event: "e"}, {Group: g + "a", Event: "e"}})
				return err
			}
		}, 3},
		{"publish in a transaction", func(t *testing.T, c *Core, g string) op {
			return func(ctx context.Context) error {
				return pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
					_, err := c.PublishTx(ctx, tx, g, "e", 0)
					return err
				})
			}
		}, 0},
		{"claim", func(t *testing.T, c *Core, g string) op {
			publish(t, c, g, 1)
			return func(ctx context.Context) error {
				l, err := c.Claim(ctx, "w", time.Minute, 0)
				return cmpErr(err, l == nil, "nothing claimed")
			}
		}, 0},
		{"claim many", func(t *testing.T, c *Core, g string) op {
			publish(t, c, g, 1)
			return func(ctx context.Context) error {
				ls, err := c.ClaimMany(ctx, "w", time.Minute, 0, 10)
				return cmpErr(err, len(ls) == 0, "nothing claimed")
			}
		}, 0},
		{"extend", func(t *testing.T, c *Core, g string) op {
			l := claimed(t, c, g, 1)
			return func(ctx context.Context) error { return c.Extend(ctx, l, time.Minute) }
		}, 0},
		{"ack", func(t *testing.T, c *Core, g string) op {
			l := claimed(t, c, g, 2)
			return func(ctx context.Context) error { return c.Ack(ctx, l) }
		}, 1},
		{"ack of the last message", func(t *testing.T, c *Core, g string) op {
			l := claimed(t, c, g, 1)
			return func(ctx context.Context) error { return c.Ack(ctx, l) }
		}, 1}, // the result does not say the group is gone
		{"ack of a lost lease", func(t *testing.T, c *Core, g string) op {
			l := lost(claimed(t, c, g, 2))
			return func(ctx context.Context) error { return wantErr(c.Ack(ctx, l), pgtransport.ErrLeaseLost) }
		}, 0},
		{"nack", func(t *testing.T, c *Core, g string) op {
			l := claimed(t, c, g, 1)
			return func(ctx context.Context) error { return c.Nack(ctx, l, 0) }
		}, 1},
		{"nack with a delay", func(t *testing.T, c *Core, g string) op {
			l := claimed(t, c, g, 1)
			return func(ctx context.Context) error { return c.Nack(ctx, l, time.Minute) }
		}, 1}, // waiters must time their sleep to the park's end
		{"nack of a lost lease", func(t *testing.T, c *Core, g string) op {
			l := lost(claimed(t, c, g, 1))
			return func(ctx context.Context) error { return wantErr(c.Nack(ctx, l, 0), pgtransport.ErrLeaseLost) }
		}, 0},
		{"ack next that keeps the group", func(t *testing.T, c *Core, g string) op {
			l := claimed(t, c, g, 2)
			return func(ctx context.Context) error {
				next, err := c.AckNext(ctx, l, time.Minute)
				return cmpErr(err, next == nil, "group not kept")
			}
		}, 0},
		{"ack next that frees the group", func(t *testing.T, c *Core, g string) op {
			l := claimed(t, c, g, 1)
			return func(ctx context.Context) error {
				next, err := c.AckNext(ctx, l, time.Minute)
				return cmpErr(err, next != nil, "group kept")
			}
		}, 1},
		{"ack next of a lost lease", func(t *testing.T, c *Core, g string) op {
			l := lost(claimed(t, c, g, 2))
			return func(ctx context.Context) error {
				_, err := c.AckNext(ctx, l, time.Minute)
				return wantErr(err, pgtransport.ErrLeaseLost)
			}
		}, 0},
		{"ack many, one lease lost", func(t *testing.T, c *Core, g string) op {
			ls := []*pgtransport.Lease{claimed(t, c, g+"a", 2), claimed(t, c, g+"b", 1), lost(claimed(t, c, g+"c", 1))}
			return func(ctx context.Context) error {
				errs, err := c.AckMany(ctx, ls)
				if err != nil {
					return err
				}
				if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], pgtransport.ErrLeaseLost) {
					return fmt.Errorf("results %v, want nil, nil, ErrLeaseLost", errs)
				}
				return nil
			}
		}, 2},
		{"exchange", func(t *testing.T, c *Core, g string) op {
			l := claimed(t, c, g, 1)
			return func(ctx context.Context) error {
				settled, _, err := c.Exchange(ctx, []*pgtransport.Lease{l}, true, "w", time.Minute, 0, 0)
				return cmpErr(err, Freed(settled) != 1, "the ack did not free its group")
			}
		}, 0}, // its caller, a stream, wakes Freed(settled) passing over its own ticket
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			db := pgtest.New(t, 2)
			c, err := New(pgtest.Context(t), db.Pool, pgtransport.Config{Schema: db.Schema})
			is.NoErr(err) // the case's queue
			run := tc.setup(t, c, "g")
			const parked = 5
			tickets := make([]*Ticket, parked)
			for i := range tickets {
				tickets[i] = c.Parking().Ticket()
			}
			is.NoErr(run(pgtest.Context(t))) // the operation
			woken := 0
			for _, tk := range tickets {
				select {
				case <-tk.C():
					woken++
				default:
					tk.Done()
				}
			}
			is.Equal(woken, tc.want) // parked callers woken
		})
	}
}

// TestFreed: a batch of acks wakes one parked caller per ack that held and
// did not keep its group.
func TestFreed(t *testing.T) {
	next := &pgtransport.Lease{}
	for _, tc := range []struct {
		name    string
		settled []Settled
		want    int
	}{
		{"none", nil, 0},
		{"freed", []Settled{{}, {}}, 2},
		{"kept", []Settled{{Next: next}}, 0},
		{"lost", []Settled{{Err: pgtransport.ErrLeaseLost}}, 0},
		{"mixed", []Settled{{}, {Next: next}, {Err: pgtransport.ErrLeaseLost}, {}}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			is.Equal(Freed(tc.settled), tc.want) // groups freed
		})
	}
}

// publish puts n messages in group through c.
func publish(t *testing.T, c *Core, group string, n int) {
	t.Helper()
	for i := range n {
		if _, err := c.Publish(pgtest.Context(t), group, fmt.Sprint(i), 0); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
}

// claimed publishes n messages in group and returns the lease on its head;
// no other group may be claimable.
func claimed(t *testing.T, c *Core, group string, n int) *pgtransport.Lease {
	t.Helper()
	publish(t, c, group, n)
	l, err := c.Claim(pgtest.Context(t), "w", time.Minute, 0)
	if err != nil || l == nil || l.Group != group {
		t.Fatalf("claim %s: %v, %v", group, l, err)
	}
	return l
}

// lost returns l with a token that holds nothing: every fence refuses it.
func lost(l *pgtransport.Lease) *pgtransport.Lease {
	c := *l
	c.Token = NewToken("nobody")
	return &c
}

// wantErr is nil when err is target, else an error saying what came.
func wantErr(err, target error) error {
	if errors.Is(err, target) {
		return nil
	}
	return fmt.Errorf("got %v, want %v", err, target)
}

// cmpErr is err, or an error saying why when bad.
func cmpErr(err error, bad bool, why string) error {
	if err == nil && bad {
		return errors.New(why)
	}
	return err
}
