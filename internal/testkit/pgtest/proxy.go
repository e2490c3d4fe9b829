package pgtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	stdsync "sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Proxy forwards PostgreSQL connections to the test server and, on demand,
// loses the reply to a chosen request after the server has committed it:
// the unlucky network of a real deployment, made exact. It reads the wire
// protocol (v3) in both directions. A request is the client's messages up
// to a Sync, or one simple Query; the server ends its reply to it with
// ReadyForQuery, which the server sends only once the request's implicit
// transaction has committed. So a reply stopped there belongs to a
// committed request, and the client can never know it.
//
// It never forwards a CancelRequest (pgx sends one on a new connection when
// a ctx ends, if so configured): a cancel arriving before the commit would
// roll it back, and the test means to lose the reply of a commit.
type Proxy struct {
	network string // of the server: tcp or unix
	target  string
	l       net.Listener

	mu     stdsync.Mutex
	rules  []*rule       // armed, oldest first
	frozen chan struct{} // non-nil while frozen; Thaw closes it
	stop   chan struct{} // closed when the proxy stops: frozen forwarding gives up

	cut, held, cancels atomic.Int64
	conns              stdsync.WaitGroup
}

// rule is an armed loss: the reply to the next request holding match.
type rule struct {
	match []byte
	hold  bool // keep the connection open, never answering; else cut it
}

// NewProxy starts a proxy in front of the test server, stopped in
// tb.Cleanup.
func NewProxy(tb testing.TB) *Proxy {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(DSN(tb))
	if err != nil {
		tb.Fatalf("pgtest: proxy: %v", err)
	}
	p := &Proxy{network: "tcp", target: net.JoinHostPort(cfg.ConnConfig.Host, fmt.Sprint(cfg.ConnConfig.Port))}
	if h := cfg.ConnConfig.Host; len(h) > 0 && h[0] == '/' {
		p.network, p.target = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", h, cfg.ConnConfig.Port)
	}
	p.stop = make(chan struct{})
	if p.l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		tb.Fatalf("pgtest: proxy: %v", err)
	}
	var (
		mu   stdsync.Mutex
		open = map[net.Conn]bool{}
		done = make(chan struct{})
	)
	go func() { // owned: Cleanup waits for it
		defer close(done)
		for {
			c, err := p.l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open[c] = true
			mu.Unlock()
			p.conns.Go(func() {
				p.serve(c)
				mu.Lock()
				delete(open, c)
				mu.Unlock()
			})
		}
	}()
	tb.Cleanup(func() {
		close(p.stop)
		p.l.Close()
		<-done
		mu.Lock()
		for c := range open {
			c.Close()
		}
		mu.Unlock()
		p.conns.Wait()
	})
	return p
}

// Pool returns a pool on db's schema whose connections go through the
// proxy, closed in tb.Cleanup.
func (p *Proxy) Pool(tb testing.TB, db *DB, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	return p.PoolOn(tb, db.DSN, db.Schema, maxConns)
}

// PoolOn returns a pool on schema of the database dsn names (on the test
// server: a partition's, say) whose connections go through the proxy,
// closed in tb.Cleanup.
func (p *Proxy) PoolOn(tb testing.TB, dsn, schema string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		tb.Fatalf("pgtest: proxy: %v", err)
	}
	addr := p.l.Addr().(*net.TCPAddr)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = addr.IP.String(), uint16(addr.Port)
	cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.RuntimeParams["application_name"] = appName(owner)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: proxy pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// CutAfterCommit arms a loss: the reply to the next request whose bytes
// hold match (a group id, a token: a statement's parameters; a cached
// statement's text is not sent again) is stopped at its ReadyForQuery,
// after the commit, and the connection is closed both ways.
func (p *Proxy) CutAfterCommit(match string) { p.arm(&rule{match: []byte(match)}) }

// HoldAfterCommit arms a loss like CutAfterCommit, but the connection
// stays open with the reply never finished, until the client gives up (a
// ctx deadline) and closes it.
func (p *Proxy) HoldAfterCommit(match string) { p.arm(&rule{match: []byte(match), hold: true}) }

func (p *Proxy) arm(r *rule) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules = append(p.rules, r)
}

// Freeze stops forwarding bytes, in both directions and on every
// connection, new ones included, while keeping every socket open: a
// server that hangs (SIGSTOP) or a network path that drops everything
// while both ends keep the TCP connection. Thaw resumes. Connections are
// still accepted while frozen; their startup waits too. A CancelRequest is
// dropped as ever.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen == nil {
		p.frozen = make(chan struct{})
	}
}

// Thaw resumes forwarding after Freeze; what waited is forwarded then.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen != nil {
		close(p.frozen)
		p.frozen = nil
	}
}

// pass waits while the proxy is frozen. It reports false once the proxy
// stops: forward nothing more.
func (p *Proxy) pass() bool {
	p.mu.Lock()
	thaw := p.frozen
	p.mu.Unlock()
	if thaw == nil {
		return true
	}
	select {
	case <-thaw:
		return true
	case <-p.stop:
		return false
	}
}

// Lost returns how many replies the proxy has cut or held so far.
func (p *Proxy) Lost() int { return int(p.cut.Load() + p.held.Load()) }

// Cancels returns how many CancelRequests the proxy dropped.
func (p *Proxy) Cancels() int { return int(p.cancels.Load()) }

// take returns the first armed rule request matches, disarming it.
func (p *Proxy) take(request []byte) *rule {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, r := range p.rules {
		if bytes.Contains(request, r.match) {
			p.rules = append(p.rules[:i:i], p.rules[i+1:]...)
			return r
		}
	}
	return nil
}

const cancelRequestCode = 80877102

// serve forwards one client connection.
func (p *Proxy) serve(client net.Conn) {
	defer client.Close()
	startup, err := readStartup(client)
	if err != nil {
		return
	}
	if binary.BigEndian.Uint32(startup[4:8]) == cancelRequestCode {
		p.cancels.Add(1)
		return // dropped: a cancel must not roll back the commit being lost
	}
	if !p.pass() {
		return
	}
	server, err := net.Dial(p.network, p.target)
	if err != nil {
		return
	}
	defer server.Close()
	if _, err := server.Write(startup); err != nil {
		return
	}
	// One entry per request, in order: what to do with its reply's end.
	// The startup's own ReadyForQuery is the first.
	var (
		mu      stdsync.Mutex
		pending = []*rule{nil}
		both    stdsync.WaitGroup
	)
	both.Go(func() { // client to server
		defer server.Close()
		var request []byte
		for {
			msg, err := readMessage(client)
			if err != nil {
				return
			}
			request = append(request, msg...)
			if msg[0] == 'S' || msg[0] == 'Q' {
				r := p.take(request)
				mu.Lock()
				pending = append(pending, r) // before the server can answer it
				mu.Unlock()
				request = request[:0]
			}
			if !p.pass() {
				return
			}
			if _, err := server.Write(msg); err != nil {
				return
			}
		}
	})
	both.Go(func() { // server to client
		defer client.Close()
		for {
			msg, err := readMessage(server)
			if err != nil {
				return
			}
			if msg[0] == 'Z' {
				mu.Lock()
				var r *rule
				if len(pending) > 0 {
					r, pending = pending[0], pending[1:]
				}
				mu.Unlock()
				switch {
				case r != nil && r.hold:
					p.held.Add(1)
					_, _ = io.Copy(io.Discard, server) // until the client's close ends the other side
					return
				case r != nil:
					p.cut.Add(1)
					server.Close()
					return
				}
			}
			if !p.pass() {
				return
			}
			if _, err := client.Write(msg); err != nil {
				return
			}
		}
	})
	both.Wait()
}

// readStartup reads the untyped first packet: length, then code and body.
func readStartup(r io.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size < 8 || size > 1<<16 {
		return nil, fmt.Errorf("startup packet of %d bytes", size)
	}
	buf := make([]byte, size)
	copy(buf, n[:])
	_, err := io.ReadFull(r, buf[4:])
	return buf, err
}

// readMessage reads one typed message: type byte, length, body.
func readMessage(r io.Reader) ([]byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(head[1:])
	if size < 4 || size > 1<<30 {
		return nil, fmt.Errorf("message %q of %d bytes", head[0], size)
	}
	buf := make([]byte, 1+size)
	copy(buf, head[:])
	_, err := io.ReadFull(r, buf[5:])
	return buf, err
}
