package core

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/pgtransport/pgtransport"
)

// Logger is the logger the transport's parts log to: Config.Logger, or
// slog.Default() when that is nil (looked up at each call, so a later
// slog.SetDefault applies). Never nil.
//
// The levels: Warn or Error for what an operator must see (a lost lease,
// a dead-lettered message, a stopped group, a lost connection, a
// shutdown that timed out); Info for a recovery; Debug for events of a
// single message in the normal course (a retry, a give-back), so that a
// healthy busy system logs nothing per message.
func (c *Core) Logger() *slog.Logger {
	if l := c.cfg.Logger; l != nil {
		return l
	}
	return slog.Default()
}

// Observer is Config.Observer, or a no-op when that is nil. Never nil, so
// a caller off the hot path may call it unconditionally; a hot path checks
// Observing first, so that without an observer it neither calls one nor
// reads the clock for one.
func (c *Core) Observer() pgtransport.Observer {
	if o := c.cfg.Observer; o != nil {
		return o
	}
	return noObserver{}
}

// Observing reports whether an observer is set: the one check an unset
// observer costs on a hot path.
func (c *Core) Observing() bool { return c.cfg.Observer != nil }

// timer starts timing a call for the observer: the zero Time, without
// reading the clock, when there is none.
func (c *Core) timer() time.Time {
	if c.cfg.Observer == nil {
		return time.Time{}
	}
	return time.Now()
}

// The observe methods report a call timed from t0 (timer) to the
// observer. Each is a nil check when there is none, inlined where it is
// called: the whole cost of an unset observer on the hot path
// (BenchmarkObserver).

func (c *Core) observePublished(t0 time.Time, n int, err error) {
	if c.cfg.Observer != nil {
		reportPublished(c.cfg.Observer, t0, n, err)
	}
}

func reportPublished(o pgtransport.Observer, t0 time.Time, n int, err error) {
	o.Published(n, time.Since(t0), err)
}

func (c *Core) observeClaimed(t0 time.Time, n int, err error) {
	if c.cfg.Observer != nil {
		reportClaimed(c.cfg.Observer, t0, n, err)
	}
}

func reportClaimed(o pgtransport.Observer, t0 time.Time, n int, err error) {
	o.Claimed(n, time.Since(t0), err)
}

func (c *Core) observeAcked(t0 time.Time, n int, err error) {
	if c.cfg.Observer != nil {
		reportAcked(c.cfg.Observer, t0, n, err)
	}
}

func reportAcked(o pgtransport.Observer, t0 time.Time, n int, err error) {
	o.Acked(n, time.Since(t0), err)
}

// observeExchange reports an Exchange of acks acks and a claim of up to
// limit to the observer: an ack and a claim (each only if the exchange
// made one, both with the round-trip's duration). The claim counts the
// leases kept too (each hands out its group's next message). Its lost
// leases are reportLost's.
func (c *Core) observeExchange(t0 time.Time, acks, limit int, settled []Settled, claimed []*pgtransport.Lease, err error) {
	if c.cfg.Observer != nil {
		if acks > 0 {
			c.observeAcked(t0, acks, err)
		}
		kept := 0
		for _, s := range settled {
			if s.Next != nil {
				kept++
			}
		}
		if limit > 0 || kept > 0 {
			c.observeClaimed(t0, kept+len(claimed), err)
		}
	}
}

// reportLost reports every ack in settled found lost (LeaseLost).
func (c *Core) reportLost(settled []Settled) {
	for _, s := range settled {
		if s.Err != nil {
			c.LeaseLost("ack", s.Lease)
		}
	}
}

// observeFailed reports a Fail of l to the observer and logs what the
// queue did with it: a dead letter or a stopped group at Warn (someone
// must look at it), a retry at Debug (the normal course of a retry
// policy).
func (c *Core) observeFailed(t0 time.Time, l *pgtransport.Lease, out FailOutcome, cause, err error) {
	if o := c.cfg.Observer; o != nil {
		reported := string(out)
		if out == FailBuried {
			reported = pgtransport.OutcomeDead // a dead letter, whatever put it there
		}
		o.Failed(l, reported, time.Since(t0), err)
	}
	if err != nil {
		return
	}
	lg := c.Logger()
	switch out {
	case FailDead:
		lg.LogAttrs(context.Background(), slog.LevelWarn, "pgtransport: message dead-lettered: it used its attempts",
			slog.String("group", l.Group), slog.Int64("seq", l.Seq), slog.Int("attempt", l.Attempt), slog.String("cause", CauseText(cause)))
	case FailBuried:
		lg.LogAttrs(context.Background(), slog.LevelWarn, "pgtransport: message dead-lettered: its handler said it can never succeed",
			slog.String("group", l.Group), slog.Int64("seq", l.Seq), slog.Int("attempt", l.Attempt), slog.String("cause", CauseText(cause)))
	case FailSnoozed:
		if lg.Enabled(context.Background(), slog.LevelDebug) {
			lg.LogAttrs(context.Background(), slog.LevelDebug, "pgtransport: message snoozed; its attempt is not counted",
				slog.String("group", l.Group), slog.Int64("seq", l.Seq), slog.Int("attempt", l.Attempt), slog.String("cause", CauseText(cause)))
		}
	case FailStopped:
		lg.LogAttrs(context.Background(), slog.LevelWarn, "pgtransport: group stopped: its head used its attempts (RestartGroup resumes it)",
			slog.String("group", l.Group), slog.Int64("seq", l.Seq), slog.Int("attempt", l.Attempt), slog.String("cause", CauseText(cause)))
	default:
		if lg.Enabled(context.Background(), slog.LevelDebug) { // no attributes built for nothing
			lg.LogAttrs(context.Background(), slog.LevelDebug, "pgtransport: message failed; it will be retried",
				slog.String("group", l.Group), slog.Int64("seq", l.Seq), slog.Int("attempt", l.Attempt), slog.String("cause", CauseText(cause)))
		}
	}
}

// LeaseLost reports that l was found lost by op (an ack, nack, fail,
// release, extend or heartbeat answered ErrLeaseLost): to the observer,
// and to the log at Warn when l had lapsed by this process's clock, since
// its message will be (or was) handed out again and its work may be done
// twice; before then only at Debug (it was settled already). The core calls it for every
// ErrLeaseLost it returns; a front-end calls it only for a loss it finds
// without the core.
func (c *Core) LeaseLost(op string, l *pgtransport.Lease) {
	if o := c.cfg.Observer; o != nil {
		o.LeaseLost(l)
	}
	lg := c.Logger()
	if c.clock == nil && time.Now().Before(l.Expiry) { // (an injected Clock runs leases out by its own time)
		// Not lapsed by this process's clock, which the database's lease
		// outlasts (Lease.Expiry): so no other worker can have it. The
		// lease was settled already (a second ack, or a handler that acked
		// by hand inside Work), or its group purged or restarted by an
		// operator: nothing for an operator to look at.
		if lg.Enabled(context.Background(), slog.LevelDebug) {
			lg.LogAttrs(context.Background(), slog.LevelDebug, "pgtransport: lease no longer held, before its expiry: settled already",
				slog.String("op", op), slog.String("group", l.Group), slog.Int64("seq", l.Seq), slog.String("token", l.Token))
		}
		return
	}
	lg.LogAttrs(context.Background(), slog.LevelWarn, "pgtransport: lease lost: the group went to another worker, or the lease lapsed",
		slog.String("op", op), slog.String("group", l.Group), slog.Int64("seq", l.Seq), slog.Int("attempt", l.Attempt),
		slog.String("token", l.Token))
}

// lostIf calls LeaseLost for l if err is ErrLeaseLost.
func (c *Core) lostIf(op string, l *pgtransport.Lease, err error) {
	if err != nil && errors.Is(err, pgtransport.ErrLeaseLost) {
		c.LeaseLost(op, l)
	}
}

// noObserver is the Observer of a transport without one.
type noObserver struct{}

func (noObserver) Published(int, time.Duration, error)                     {}
func (noObserver) Claimed(int, time.Duration, error)                       {}
func (noObserver) Acked(int, time.Duration, error)                         {}
func (noObserver) Failed(*pgtransport.Lease, string, time.Duration, error) {}
func (noObserver) LeaseLost(*pgtransport.Lease)                            {}
func (noObserver) Handled(*pgtransport.Lease, time.Duration, error)        {}
