package notify

import (
	"log/slog"
	stdsync "sync"

	"github.com/jackc/pgx/v5/pgxpool"
)

// shared is the process-wide registry behind Shared: one Listener per
// pool, with a count of its users.
var shared = struct {
	mu stdsync.Mutex
	m  map[any]*sharedListener // by *pgxpool.Pool, or dsnKey
}{m: map[any]*sharedListener{}}

// dsnKey is SharedDSN's key in the registry.
type dsnKey string

type sharedListener struct {
	l    *Listener
	refs int
}

// Shared returns the process's Listener for pool, made on first use (its
// connection taken out of pool with FromPool, logging to logger: nil means
// slog.Default()), and a release function.
// Every caller for the same pool shares one Listener, so a process holds
// one LISTEN connection per pool however many transports use it. Each
// caller must call release once when done (later calls do nothing); the
// last release closes the Listener, and a later Shared makes a new one.
// The Listener logs to the logger of the call that made it.
func Shared(pool *pgxpool.Pool, logger *slog.Logger) (l *Listener, release func()) {
	return share(pool, Config{Connect: FromPool(pool), Logger: logger})
}

// SharedDSN is Shared for a Listener that connects to dsn (FromDSN,
// refusing a connection through a pooler: Direct) instead of taking a
// connection out of a pool: one Listener per process and dsn.
func SharedDSN(dsn string, logger *slog.Logger) (l *Listener, release func()) {
	return share(dsnKey(dsn), Config{Connect: Direct(FromDSN(dsn)), Logger: logger})
}

// share returns the Listener registered under key, made with cfg if there
// is none, and its release function.
func share(key any, cfg Config) (*Listener, func()) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	s := shared.m[key]
	if s == nil {
		l, _ := New(cfg) // Connect is set: no error
		s = &sharedListener{l: l}
		shared.m[key] = s
	}
	s.refs++
	var once stdsync.Once
	return s.l, func() {
		once.Do(func() {
			shared.mu.Lock()
			s.refs--
			last := s.refs == 0
			if last {
				delete(shared.m, key)
			}
			shared.mu.Unlock()
			if last {
				s.l.Close()
			}
		})
	}
}
