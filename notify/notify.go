// Package notify holds one LISTEN connection and fans its notifications out
// to any number of subscribers. It is built on github.com/jackc/pgxlisten.
//
// A Listener connects on its first subscription and reconnects on its own,
// with backoff from 100 ms up to 2 s, whenever the connection breaks. After
// every (re)connect each subscriber is woken once, as if notified: a
// notification sent while no connection listened is gone, so a subscriber
// must then look for work itself (sweep). Readiness is observable with Ready.
//
// The connection is the Listener's alone: FromPool takes one out of a pool
// (pgxpool's Hijack), so it never goes back to the pool while listening.
// Through a transaction pooler (PgBouncer's pool_mode=transaction) LISTEN
// never delivers: the pooler hands the server connection to other clients
// once the LISTEN's transaction ends. Connect straight to PostgreSQL then
// (FromDSN, SharedDSN), and wrap the Connect in Direct to refuse a
// connection that goes through a pooler after all.
package notify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	stdsync "sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgxlisten"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/outage"
	"github.com/pgtransport/pgtransport/internal/pooler"
)

// ErrClosed is returned by Subscribe after Close.
var ErrClosed = errors.New("notify: listener closed")

// Config configures a Listener. Connect is required.
type Config struct {
	// Connect returns a connection for the Listener's exclusive use; the
	// Listener closes it. FromPool and FromDSN make one.
	Connect func(ctx context.Context) (*pgx.Conn, error)

	// OnError, if set, is told of every connection failure (from the
	// Listener's goroutine; it must not block). Optional.
	OnError func(error)

	// Logger receives the Listener's connection trouble: the first
	// failure of an outage at Warn (the retries that fail too at Debug),
	// and the reconnect that ends it at Info. Nil means slog.Default().
	Logger *slog.Logger
}

// FromPool connects by taking a connection out of pool for good: the pool
// forgets it and may open another in its place.
func FromPool(pool *pgxpool.Pool) func(ctx context.Context) (*pgx.Conn, error) {
	return func(ctx context.Context) (*pgx.Conn, error) {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		return c.Hijack(), nil
	}
}

// FromDSN connects with pgx.Connect(ctx, dsn).
func FromDSN(dsn string) func(ctx context.Context) (*pgx.Conn, error) {
	return func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, dsn) }
}

// ErrPooled is the error of a Direct connect that reached PostgreSQL
// through a pooler, through which a transaction-mode pooler delivers no
// notification.
var ErrPooled = errors.New("notify: the connection goes through a pooler (LISTEN needs one straight to PostgreSQL)")

// Direct wraps connect so that a connection that goes through a pooler is
// closed and refused with ErrPooled: one whose pg_backend_pid() differs
// from the process id the server reported when it connected (PgBouncer,
// in every pool mode, reports one of its own making; see
// pgtransport.PoolingDetect).
func Direct(connect func(ctx context.Context) (*pgx.Conn, error)) func(ctx context.Context) (*pgx.Conn, error) {
	return func(ctx context.Context) (*pgx.Conn, error) {
		conn, err := connect(ctx)
		if err != nil {
			return nil, err
		}
		through, err := pooler.Through(ctx, conn)
		if err == nil && through {
			err = ErrPooled
		}
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			_ = conn.Close(cctx)
			return nil, err
		}
		return conn, nil
	}
}

// Listener is one LISTEN connection shared by its subscribers. Its methods
// are safe for concurrent use.
type Listener struct {
	cfg Config

	mu       stdsync.Mutex
	channels map[string]*channel
	pid      uint32             // backend of the current connection, 0 if none
	restart  context.CancelFunc // ends the current pgxlisten run
	cancel   context.CancelFunc // ends the Listener's goroutine
	done     chan struct{}      // closed when that goroutine has returned
	closed   bool
	retry    *backoff.ExponentialBackOff // owned by the Listener's goroutine
	failed   bool                        // the last connection failed or broke: back off before the next
	outage   outage.Log                  // the run of connection failures under way; the goroutine's
}

type channel struct {
	subs  map[*Subscription]struct{}
	ready chan struct{} // closed while LISTEN holds on the current connection
	up    bool
}

// New returns a Listener; it connects on the first Subscribe.
func New(cfg Config) (*Listener, error) {
	if cfg.Connect == nil {
		return nil, fmt.Errorf("notify: %w: Config.Connect is nil", pgtransport.ErrInvalidConfig)
	}
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 2 * time.Second
	b.MaxElapsedTime = 0 // retry for as long as the Listener lives
	return &Listener{cfg: cfg, channels: map[string]*channel{}, retry: b}, nil
}

// Subscription receives wake-ups for one channel: a value on C for each
// notification, and one after each (re)connect. C holds at most one pending
// wake-up; more are folded into it.
type Subscription struct {
	l       *Listener
	channel string
	c       chan struct{}
}

// C is the subscription's wake-up channel. It is never closed; stop
// receiving after Close.
func (s *Subscription) C() <-chan struct{} { return s.c }

// Ready returns a channel that is closed once the Listener listens on the
// subscription's channel. A lost connection makes Ready return a new, open
// channel until the next connect listens again.
func (s *Subscription) Ready() <-chan struct{} { return s.l.Ready(s.channel) }

// Close ends the subscription. Safe to call twice.
func (s *Subscription) Close() {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	if ch := s.l.channels[s.channel]; ch != nil {
		delete(ch.subs, s)
	}
}

// Subscribe starts listening on name (if the Listener does not already) and
// returns a subscription to it. A new channel makes the Listener reconnect
// once to listen on it too; its other subscribers get a wake-up for that.
func (l *Listener) Subscribe(name string) (*Subscription, error) {
	if name == "" {
		return nil, fmt.Errorf("notify: %w: empty channel name", pgtransport.ErrInvalidConfig)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	s := &Subscription{l: l, channel: name, c: make(chan struct{}, 1)}
	ch := l.channels[name]
	if ch == nil {
		ch = &channel{subs: map[*Subscription]struct{}{}, ready: make(chan struct{})}
		l.channels[name] = ch
		if l.restart != nil {
			l.restart() // listen again, now with name
		}
	}
	ch.subs[s] = struct{}{}
	if l.done == nil {
		ctx, cancel := context.WithCancel(context.Background())
		l.cancel, l.done = cancel, make(chan struct{})
		go l.run(ctx)
	}
	return s, nil
}

// Ready returns a channel closed while the Listener listens on name.
func (l *Listener) Ready(name string) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch := l.channels[name]
	if ch == nil {
		return make(chan struct{}) // never subscribed: never ready
	}
	return ch.ready
}

// BackendPID returns the server process of the listening connection, or 0
// while there is none.
func (l *Listener) BackendPID() uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pid
}

// Close stops listening, closes the connection and waits for the Listener's
// goroutine to return. Safe to call twice.
func (l *Listener) Close() {
	l.mu.Lock()
	l.closed = true
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// run is the Listener's goroutine: one pgxlisten run per set of channels,
// started again when a channel is added.
func (l *Listener) run(ctx context.Context) {
	defer close(l.done)
	for ctx.Err() == nil {
		pl := &pgxlisten.Listener{
			Connect:        l.connect,
			LogError:       l.logError,
			ReconnectDelay: -1, // connect backs off itself
		}
		inner, restart := context.WithCancel(ctx)
		l.mu.Lock()
		for name := range l.channels {
			pl.Handle(name, handler{l})
		}
		l.restart = restart
		l.mu.Unlock()
		_ = pl.Listen(inner) // returns only when inner ends
		restart()
		l.down()
	}
}

// connect is pgxlisten's Connect: it marks every channel down (the old
// connection is gone), waits out the backoff after a failure, and connects.
func (l *Listener) connect(ctx context.Context) (*pgx.Conn, error) {
	l.down()
	if l.failed {
		t := time.NewTimer(l.retry.NextBackOff())
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	l.failed = true // until a channel is listened on
	conn, err := l.cfg.Connect(ctx)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.pid = conn.PgConn().PID()
	l.mu.Unlock()
	return conn, nil
}

// down marks every channel not listened on.
func (l *Listener) down() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pid = 0
	for _, ch := range l.channels {
		if ch.up {
			ch.up = false
			ch.ready = make(chan struct{})
		}
	}
}

func (l *Listener) logError(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return // shutting down or restarting: not a failure
	}
	l.down()
	l.outage.Failed(l.logger(), "pgtransport: notify: listener connection failed; reconnecting (subscribers sweep for work meanwhile)", err)
	if l.cfg.OnError != nil {
		l.cfg.OnError(err)
	}
}

// logger is Config.Logger, or slog.Default().
func (l *Listener) logger() *slog.Logger {
	if l.cfg.Logger != nil {
		return l.cfg.Logger
	}
	return slog.Default()
}

// handler fans a channel's notifications out, and marks it ready (waking
// everyone to sweep) once LISTEN holds.
type handler struct{ l *Listener }

func (h handler) HandleNotification(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
	h.l.wake(n.Channel)
	return nil
}

func (h handler) HandleBacklog(_ context.Context, name string, _ *pgx.Conn) error {
	l := h.l
	l.failed = false
	l.retry.Reset()
	l.outage.Recovered(l.logger(), "pgtransport: notify: listener reconnected", slog.String("channel", name))
	l.mu.Lock()
	if ch := l.channels[name]; ch != nil && !ch.up {
		ch.up = true
		close(ch.ready)
	}
	l.mu.Unlock()
	l.wake(name)
	return nil
}

// wake gives every subscriber of name a pending wake-up, never blocking.
func (l *Listener) wake(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch := l.channels[name]
	if ch == nil {
		return
	}
	for s := range ch.subs {
		select {
		case s.c <- struct{}{}:
		default:
		}
	}
}
