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
	m  map[*pgxpool.Pool]*sharedListener
}{m: map[*pgxpool.Pool]*sharedListener{}}

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
	shared.mu.Lock()
	defer shared.mu.Unlock()
	s := shared.m[pool]
	if s == nil {
		l, _ := New(Config{Connect: FromPool(pool), Logger: logger}) // Connect is set: no error
		s = &sharedListener{l: l}
		shared.m[pool] = s
	}
	s.refs++
	var once stdsync.Once
	return s.l, func() {
		once.Do(func() {
			shared.mu.Lock()
			s.refs--
			last := s.refs == 0
			if last {
				delete(shared.m, pool)
			}
			shared.mu.Unlock()
			if last {
				s.l.Close()
			}
		})
	}
}
