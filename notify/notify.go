// Package notify holds one LISTEN connection and fans its notifications out
// to any number of subscribers. It is built on github.com/jackc/pgxlisten.
//
// A Listener connects on its first subscription and reconnects on its own,
// with backoff from 100 ms up to 2 s, whenever the connection breaks. After
// every (re)connect each subscriber is woken once, as if notified: a
// notification sent while no connection listened is gone, so a subscriber
// must then look for work itself (sweep). Readiness is observable with Ready.
//
// A connection can also stop delivering without breaking: a server process
// that hangs (SIGSTOP, a stuck host) or a network that drops packets while
// both ends keep the TCP connection (the kernel still ACKs, so keepalives do
// not see it). Waiting cannot tell that from quiet, so the Listener checks
// delivery end to end: it also listens on a probe channel of its own, and
// after every Config.PingInterval without a notification it sends one to
// that channel through another connection (Config.Probe). If that
// notification does not come back on the listening connection within
// Config.PingTimeout, it marks every channel not ready at once, drops the
// connection and connects again (through a multi-host DSN, to whichever
// host now answers). So Ready is never left closed for longer than
// PingInterval + PingTimeout after the connection stops delivering.
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
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
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

	// Probe sends a notification on channel, the Listener's probe channel,
	// through a connection other than the listening one, to the same
	// database: SELECT pg_notify(channel, ''). ProbeThrough(pool) makes one.
	// It may go through a pooler (NOTIFY is delivered by the server, to
	// every connection listening there), and it should follow the database
	// where the listening connection's Connect would reconnect, so that
	// after a failover a listener left on the old primary hears nothing and
	// moves. A Probe that reaches another database makes the Listener
	// reconnect after every PingInterval + PingTimeout of quiet. Nil turns
	// the check off, as a negative PingInterval does: the listening
	// connection alone cannot be checked while pgxlisten waits on it.
	Probe func(ctx context.Context, channel string) error

	// PingInterval is how long the listening connection may go without a
	// notification before the Listener probes it (Probe). Shorter finds a
	// hung server or a dead network path sooner, at one tiny NOTIFY per
	// interval per idle Listener. A connection that carries notifications
	// is not probed: each one proves it delivers. 0 means
	// DefaultPingInterval; negative turns the check off (a hung
	// connection is then noticed only if the kernel breaks it).
	PingInterval time.Duration

	// PingTimeout is how long the probe's notification has to come back on
	// the listening connection, the Probe call included; while the check is
	// on it also bounds each connect, and the LISTENs after a connect. A
	// connection that misses it is dropped and replaced. Too short turns a
	// server that is merely slow into needless reconnects (each costs the
	// subscribers one sweep). 0 (or negative) means DefaultPingTimeout.
	PingTimeout time.Duration
}

const (
	// DefaultPingInterval is Config.PingInterval's value when it is 0.
	DefaultPingInterval = 10 * time.Second
	// DefaultPingTimeout is Config.PingTimeout's value when it is 0.
	DefaultPingTimeout = 5 * time.Second
)

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

// ProbeThrough is a Config.Probe that notifies through pool.
func ProbeThrough(pool *pgxpool.Pool) func(ctx context.Context, channel string) error {
	return func(ctx context.Context, channel string) error {
		_, err := pool.Exec(ctx, "SELECT pg_notify($1, '')", channel)
		return err
	}
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
	cfg   Config
	probe string // the probe channel, the Listener's own

	mu       stdsync.Mutex
	channels map[string]*channel
	pid      uint32             // backend of the current connection, 0 if none
	restart  context.CancelFunc // ends the current pgxlisten run
	cancel   context.CancelFunc // ends the Listener's goroutine
	done     chan struct{}      // closed when that goroutine has returned
	closed   bool
	retry    *backoff.ExponentialBackOff // owned by the goroutine running pgxlisten
	failed   bool                        // the last connection failed or broke: back off before the next
	outage   outage.Log                  // the run of connection failures under way; as retry
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
	cfg.PingInterval = cmp.Or(cfg.PingInterval, DefaultPingInterval)
	cfg.PingTimeout = cmp.Or(max(cfg.PingTimeout, 0), DefaultPingTimeout)
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 2 * time.Second
	b.MaxElapsedTime = 0 // retry for as long as the Listener lives
	id := make([]byte, 8)
	_, _ = rand.Read(id) // never fails
	return &Listener{
		cfg:      cfg,
		probe:    "pgtransport_probe_" + hex.EncodeToString(id), // a plain identifier, well under 63 bytes
		channels: map[string]*channel{},
		retry:    b,
	}, nil
}

// checking reports whether the liveness check is on.
func (l *Listener) checking() bool { return l.cfg.PingInterval > 0 && l.cfg.Probe != nil }

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
// subscription's channel. A lost connection, or one that no longer
// delivers (see the package doc), makes Ready return a new, open channel
// until the next connect listens again.
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
// goroutines to return. Safe to call twice.
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
// started again when a channel is added or, with the check on, when the
// connection stops delivering. With the check on, pgxlisten runs on a
// goroutine of its own, which run waits for, while run watches it.
//
// A run ends by its ctx, and pgxlisten closes its connection with that
// ctx, cancelled by then: pgconn's context watcher cuts the goodbye to a
// hung server short (its default handler at once, a
// CancelRequestContextWatcherHandler after its DeadlineDelay), so the run
// returns promptly and Close stays bounded.
func (l *Listener) run(ctx context.Context) {
	defer close(l.done)
	for ctx.Err() == nil {
		inner, restart := context.WithCancel(ctx)
		pl := &pgxlisten.Listener{
			Connect:        l.connect,
			LogError:       l.logError,
			ReconnectDelay: -1, // connect backs off itself
		}
		l.mu.Lock()
		var w *watch
		if l.checking() {
			w = &watch{l: l, n: len(l.channels) + 1, kick: make(chan struct{}, 1)}
			pl.Connect, pl.LogError = w.connect, w.logError
			pl.Handle(l.probe, w)
		}
		for name := range l.channels {
			pl.Handle(name, handler{l, w})
		}
		l.restart = restart
		l.mu.Unlock()
		if w == nil {
			_ = pl.Listen(inner) // returns only when inner ends
		} else {
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				_ = pl.Listen(inner) // returns only when inner ends
			}()
			if err := w.watch(inner, ended); err != nil {
				restart()
				l.down() // at once: nothing arrives on this connection
				<-ended
				l.fail(err) // once pgxlisten is done with retry and outage
			}
		}
		restart()
		l.down()
	}
}

// connect is pgxlisten's Connect: it marks every channel down (the old
// connection is gone), waits out the backoff after a failure, and
// connects, within PingTimeout while the check is on: a host that accepts
// connections and then hangs must not hold the Listener for ever.
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
	cctx := ctx
	if l.checking() {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, l.cfg.PingTimeout)
		defer cancel()
	}
	conn, err := l.cfg.Connect(cctx)
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

// logError is pgxlisten's LogError: a failed connection, unless ctx ended
// it (shutting down or restarting: not a failure).
func (l *Listener) logError(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	l.fail(err)
}

// fail marks every channel down and reports err, the failure of a
// connection, as the first of an outage or one more.
func (l *Listener) fail(err error) {
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
// everyone to sweep) once LISTEN holds. w, the run's watch, is nil when
// the check is off.
type handler struct {
	l *Listener
	w *watch
}

func (h handler) HandleNotification(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
	h.l.wake(n.Channel)
	if h.w != nil {
		h.w.heard()
	}
	return nil
}

func (h handler) HandleBacklog(ctx context.Context, name string, _ *pgx.Conn) error {
	l := h.l
	l.failed = false
	l.retry.Reset()
	l.outage.Recovered(l.logger(), "pgtransport: notify: listener reconnected", slog.String("channel", name))
	l.mu.Lock()
	// Under mu, after the watch has cancelled ctx and before its down: a
	// run given up on marks nothing ready.
	if ch := l.channels[name]; ch != nil && !ch.up && ctx.Err() == nil {
		ch.up = true
		close(ch.ready)
	}
	l.mu.Unlock()
	l.wake(name)
	if h.w != nil {
		h.w.listened()
	}
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
