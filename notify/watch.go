package notify

import (
	"context"
	"errors"
	"fmt"
	stdsync "sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// watch is one pgxlisten run's liveness check. pgxlisten's goroutine tells
// it what the connection does (through connect, logError and the
// handlers); the Listener's goroutine, in watch.watch, probes and judges.
// Evidence that the connection delivers is a notification on any of its
// channels, or LISTEN done on all of them after a connect.
type watch struct {
	l    *Listener
	n    int           // channels the run listens on, the probe channel included
	kick chan struct{} // a hint to watch.watch: evidence came, or a new deadline

	mu        stdsync.Mutex
	connected bool      // a connection is up: connected, and not failed since
	listens   int       // LISTENs done on it
	asked     time.Time // when evidence was last asked for: the connect, or a probe
	probing   bool      // asked is a probe's
	last      time.Time // the last evidence
}

// watch checks the run's connections until ended, which closes when
// pgxlisten has returned: after every PingInterval without evidence it
// sends a probe, and evidence is due within PingTimeout of a probe or a
// connect. It returns why the current connection is given up, after which
// the caller must cancel the run; nil once the run has ended on its own.
func (w *watch) watch(ctx context.Context, ended <-chan struct{}) error {
	interval, timeout := w.l.cfg.PingInterval, w.l.cfg.PingTimeout
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		w.mu.Lock()
		connected, asked, probing, last := w.connected, w.asked, w.probing, w.last
		w.mu.Unlock()
		now := time.Now()
		var next time.Time // zero: nothing is due until a kick
		switch {
		case !connected: // connect bounds itself
		case last.Before(asked): // evidence outstanding
			if next = asked.Add(timeout); !now.Before(next) {
				if ctx.Err() != nil {
					<-ended
					return nil // the run was ended anyway: not a failure
				}
				if probing {
					return fmt.Errorf("listening connection: the probe notification did not arrive within %v", timeout)
				}
				return fmt.Errorf("listening connection: LISTEN not done within %v of connecting", timeout)
			}
		default: // quiet since last
			if next = last.Add(interval); !now.Before(next) {
				if err := w.probe(ctx); err != nil {
					return err
				}
				continue
			}
		}
		var fire <-chan time.Time
		if !next.IsZero() {
			timer.Reset(next.Sub(now))
			fire = timer.C
		}
		select {
		case <-ended:
			return nil
		case <-w.kick:
		case <-fire:
		}
	}
}

// probe asks for evidence: it sends a notification to the probe channel
// through Config.Probe, within PingTimeout. A failed send gives the
// connection up at once (a Probe that cannot reach the database means the
// listening connection may well be on a host that is gone).
func (w *watch) probe(ctx context.Context) error {
	w.mu.Lock()
	w.asked, w.probing = time.Now(), true
	w.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, w.l.cfg.PingTimeout)
	defer cancel()
	err := w.l.cfg.Probe(pctx, w.l.probe)
	switch {
	case err == nil || ctx.Err() != nil:
		return nil
	case errors.Is(err, errNoProbe):
		w.heard() // nothing to probe through for now: ask again after PingInterval
		return nil
	}
	return fmt.Errorf("listening connection: probe: %w", err)
}

// connect is pgxlisten's Connect with the check on.
func (w *watch) connect(ctx context.Context) (*pgx.Conn, error) {
	w.reset()
	conn, err := w.l.connect(ctx)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.connected, w.asked, w.probing = true, time.Now(), false
	w.mu.Unlock()
	w.poke()
	return conn, nil
}

// logError is pgxlisten's LogError with the check on.
func (w *watch) logError(ctx context.Context, err error) {
	if ctx.Err() == nil {
		w.reset() // the connection failed: nothing to watch until the next
	}
	w.l.logError(ctx, err)
}

// reset forgets the connection.
func (w *watch) reset() {
	w.mu.Lock()
	w.connected, w.listens = false, 0
	w.mu.Unlock()
}

// listened counts a LISTEN done; the last one is evidence.
func (w *watch) listened() {
	w.mu.Lock()
	w.listens++
	all := w.listens == w.n
	w.mu.Unlock()
	if all {
		w.heard()
	}
}

// heard records evidence, telling watch.watch if it was due.
func (w *watch) heard() {
	w.mu.Lock()
	due := w.last.Before(w.asked)
	w.last = time.Now()
	w.mu.Unlock()
	if due {
		w.poke()
	}
}

// poke wakes watch.watch, never blocking: the hint is coalesced.
func (w *watch) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// HandleNotification is the probe channel's: evidence, waking nobody.
func (w *watch) HandleNotification(context.Context, *pgconn.Notification, *pgx.Conn) error {
	w.heard()
	return nil
}

// HandleBacklog is the probe channel's: one more LISTEN done.
func (w *watch) HandleBacklog(context.Context, string, *pgx.Conn) error {
	w.listened()
	return nil
}
