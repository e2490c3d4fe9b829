package notify

import (
	"context"
	"errors"
	"slices"
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
	l      *Listener
	refs   int
	probes []*holder // the users that gave a Config.Probe, oldest first
}

// holder is one user's Config.Probe.
type holder struct {
	probe func(ctx context.Context, channel string) error
}

// errNoProbe is a shared Listener's Probe error while no user gave one:
// the check waits for one.
var errNoProbe = errors.New("notify: no probe")

// Shared returns the process's Listener for pool, made on first use with
// cfg (its Connect replaced by FromPool(pool): the connection is taken out
// of pool; a nil Probe by ProbeThrough(pool)), and a release function.
// Every caller for the same pool shares one Listener, so a process holds
// one LISTEN connection per pool however many transports use it. Each
// caller must call release once when done (later calls do nothing); the
// last release closes the Listener, and a later Shared makes a new one.
// The Listener keeps the cfg of the call that made it (its Logger, its
// PingInterval), but for Probe: it probes through the Probe of the
// longest-standing caller that has not released it.
func Shared(pool *pgxpool.Pool, cfg Config) (l *Listener, release func()) {
	cfg.Connect = FromPool(pool)
	if cfg.Probe == nil {
		cfg.Probe = ProbeThrough(pool)
	}
	return share(pool, cfg)
}

// SharedDSN is Shared for a Listener that connects to dsn (FromDSN,
// refusing a connection through a pooler: Direct; cfg.Connect is replaced)
// instead of taking a connection out of a pool: one Listener per process
// and dsn. A nil cfg.Probe is left nil: that caller gives none.
func SharedDSN(dsn string, cfg Config) (l *Listener, release func()) {
	cfg.Connect = Direct(FromDSN(dsn))
	return share(dsnKey(dsn), cfg)
}

// share returns the Listener registered under key, made with cfg if there
// is none, and its release function.
func share(key any, cfg Config) (*Listener, func()) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	s := shared.m[key]
	if s == nil {
		s = &sharedListener{}
		lcfg := cfg
		lcfg.Probe = s.probe // a caller's Probe may stop working when it releases (its pool closed)
		s.l, _ = New(lcfg)   // Connect is set: no error
		shared.m[key] = s
	}
	s.refs++
	h := &holder{probe: cfg.Probe}
	if h.probe != nil {
		s.probes = append(s.probes, h)
	}
	var once stdsync.Once
	return s.l, func() {
		once.Do(func() {
			shared.mu.Lock()
			s.refs--
			s.probes = slices.DeleteFunc(s.probes, func(p *holder) bool { return p == h })
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

// probe is a shared Listener's Config.Probe: the oldest holder's.
func (s *sharedListener) probe(ctx context.Context, channel string) error {
	shared.mu.Lock()
	var p func(ctx context.Context, channel string) error
	if len(s.probes) > 0 {
		p = s.probes[0].probe
	}
	shared.mu.Unlock()
	if p == nil {
		return errNoProbe
	}
	return p(ctx, channel)
}
