// Package dashboard serves a live web page over a pgtransport queue, for
// `pgtransport serve`: the overview (depth, groups by state, oldest head,
// dead letters, and a chart of published and acked messages per second and
// of depth over the last minutes, refreshed by polling a JSON endpoint), the
// groups (the stuck-first lists, a page per group with its next messages
// and holder) and the dead letters (a page of them, one in detail).
//
// Actions (pause, resume and purge a group; redrive or purge a dead
// letter) are refused unless Config.AllowActions. Each goes through a
// confirmation page, is a POST, and is refused from another site: the
// browser's Sec-Fetch-Site or Origin must say same origin, and the form must
// carry the server's per-process token. Every request's Host must be an IP
// address, localhost, or one of Config.Hosts, so a DNS-rebinding page
// cannot read the token.
//
// Load on the database is bounded by the server, not by the number of
// open pages: one sampler (Run) reads Stats and two counters every
// Config.Interval, and the pages poll its latest sample. Lists are pages
// of at most PageSize rows; nothing reads a whole table but the group
// lists that must filter every group row (held longest, most attempts;
// the library's: under 0.2 s per million groups).
package dashboard

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtransport/pgtransport"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

const (
	// DefaultInterval is Config.Interval's zero value.
	DefaultInterval = 2 * time.Second
	// DefaultWindow is Config.Window's zero value.
	DefaultWindow = 5 * time.Minute
	// PageSize is the rows of one page of groups or dead letters.
	PageSize = 50
	// PeekSize is the messages a group's page shows.
	PeekSize = 20
	// requestTimeout bounds each request's database work.
	requestTimeout = 15 * time.Second
)

// DB is what the dashboard reads beside the transport: the sequence of
// seqs and the table's delete counter (for the rates) and the server's
// clock. A *pgxpool.Pool satisfies it.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures a Server. Transport and DB are required.
type Config struct {
	Transport *pgsync.Transport
	DB        DB
	// Schema is the queue's schema, as the transport's Config.Schema (""
	// the connection's current schema).
	Schema string
	// AllowActions turns on pause, resume, purge, redrive and dead purge.
	AllowActions bool
	// Interval is how often Run samples the queue (0: DefaultInterval).
	// Each sample is one Stats call and one small query.
	Interval time.Duration
	// Window is the chart's span (0: DefaultWindow).
	Window time.Duration
	// Hosts are host names (besides IP addresses and localhost) that
	// requests may name in their Host header: the names a proxy in front
	// serves the dashboard under.
	Hosts []string
	// Logger receives sampling and action errors (nil: slog.Default()).
	Logger *slog.Logger
}

// Server is the dashboard: an http.Handler, and the sampler Run.
type Server struct {
	cfg   Config
	token string
	cop   *http.CrossOriginProtection
	mux   *http.ServeMux
	pages map[string]pageTemplate

	mu      sync.Mutex
	samples []sample // oldest first, at most Window/Interval+1
	lastErr error    // the last sample's error, nil if it worked

	tenantsMu    sync.Mutex
	tenantsReads [2]tenantsReading // the tenants page's last two readings, oldest first
}

// New checks cfg and returns a Server. Nothing is read until Run or a
// request.
func New(cfg Config) (*Server, error) {
	if cfg.Transport == nil || cfg.DB == nil {
		return nil, errors.New("dashboard: Config.Transport and Config.DB are required")
	}
	if cfg.Interval < 0 || cfg.Window < 0 {
		return nil, errors.New("dashboard: negative Interval or Window")
	}
	cfg.Interval = cmp.Or(cfg.Interval, DefaultInterval)
	cfg.Window = cmp.Or(cfg.Window, DefaultWindow)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, token: hex.EncodeToString(b[:]), cop: http.NewCrossOriginProtection(), pages: pages}
	s.routes()
	return s, nil
}

// ServeHTTP serves the dashboard, after checking the Host header.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.hostAllowed(r.Host) {
		http.Error(w, "dashboard: unexpected Host header (start serve with --host NAME to allow a name)", http.StatusMisdirectedRequest)
		return
	}
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	s.mux.ServeHTTP(w, r.WithContext(ctx))
}

// hostAllowed: an IP address or localhost (a DNS-rebinding page has
// neither), or a name from Config.Hosts.
func (s *Server) hostAllowed(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if net.ParseIP(host) != nil || strings.EqualFold(host, "localhost") {
		return true
	}
	return slices.ContainsFunc(s.cfg.Hosts, func(h string) bool { return strings.EqualFold(h, host) })
}

// Run samples the queue every Config.Interval until ctx ends, then
// returns nil. It starts no goroutine. Errors are kept for the overview
// to show and logged when they change.
func (s *Server) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	var logged string
	for {
		sctx, cancel := context.WithTimeout(ctx, max(s.cfg.Interval, requestTimeout))
		sm, err := s.sample(sctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		s.record(sm, err)
		switch {
		case err != nil && err.Error() != logged:
			logged = err.Error()
			s.cfg.Logger.Error("dashboard: sample the queue", "err", err)
		case err == nil && logged != "":
			logged = ""
			s.cfg.Logger.Info("dashboard: sampling works again")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// record keeps a sample (or the error that stood for it), dropping those
// older than the window.
func (s *Server) record(sm sample, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastErr = err
	if err != nil {
		return
	}
	s.samples = append(s.samples, sm)
	cut := sm.Stats.At.Add(-s.cfg.Window - s.cfg.Interval)
	i := 0
	for i < len(s.samples)-1 && s.samples[i].Stats.At.Before(cut) {
		i++
	}
	s.samples = slices.Delete(s.samples, 0, i)
}

// latest returns the samples (a copy) and the last error.
func (s *Server) latest() ([]sample, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.samples), s.lastErr
}

// sample reads the queue once: Stats, then the counters.
func (s *Server) sample(ctx context.Context) (sample, error) {
	st, err := s.cfg.Transport.Stats(ctx)
	if err != nil {
		return sample{}, fmt.Errorf("stats: %w", err)
	}
	sm := sample{Stats: st}
	counters := "harel_counters"
	if s.cfg.Schema != "" {
		counters = pgx.Identifier{s.cfg.Schema, counters}.Sanitize()
	}
	// How many were ever published and deleted (harel_counters: one row,
	// or one per partition through a proxy).
	err = s.cfg.DB.QueryRow(ctx, `
		SELECT COALESCE(sum(c.published), 0)::BIGINT,
		       CASE WHEN bool_or(c.deleted < 0) THEN -1 ELSE COALESCE(sum(c.deleted), 0) END::BIGINT
		  FROM `+counters+`() AS c`).
		Scan(&sm.Published, &sm.Deleted)
	if err != nil {
		return sample{}, fmt.Errorf("read the seq counter: %w", err)
	}
	return sm, nil
}

// serverNow is the database server's clock, against which holders' and
// messages' times are shown.
func (s *Server) serverNow(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := s.cfg.DB.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("read the server's clock: %w", err)
	}
	return now, nil
}

// errNoSample: the sampler has not read the queue yet.
var errNoSample = errors.New("no sample of the queue yet")

// stats is the latest sample's Stats. With none yet, read says whether
// to read them now (a page load) or not (a poll: polls never add load on
// the database, however many pages are open).
func (s *Server) stats(ctx context.Context, read bool) (pgtransport.Stats, error) {
	samples, _ := s.latest()
	if n := len(samples); n > 0 {
		return samples[n-1].Stats, nil
	}
	if !read {
		return pgtransport.Stats{}, errNoSample
	}
	return s.cfg.Transport.Stats(ctx)
}
