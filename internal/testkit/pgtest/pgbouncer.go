package pgtest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	stdsync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BouncerPoolSize is how many server connections the test PgBouncer keeps
// for the test database (default_pool_size): few, so that its clients
// take turns on them and any reliance on session state shows.
const BouncerPoolSize = 2

// bouncerInstall is what a test that needs PgBouncer says when there is none.
const bouncerInstall = "PGBOUNCER IS NOT INSTALLED: this test runs through it and is skipped. Install it (Debian/Ubuntu: apt-get update -qq && apt-get install -y -qq pgbouncer); .ci/run does."

// PgBouncer is a pgbouncer process in transaction pooling mode in front of
// the test server: started by the first test that asks (Bouncer), once per
// test binary, listening on a free port of 127.0.0.1, with its files in a
// temporary directory; Main (Shutdown) stops it.
type PgBouncer struct {
	dir    string
	port   int
	dbname string
	user   string
	server *pgx.ConnConfig // where it forwards to, for Reroute
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has exited
	out    bytes.Buffer  // its stdout and stderr; read after exited
}

var bouncer struct {
	mu  stdsync.Mutex
	b   *PgBouncer
	err error
}

// Bouncer returns the test binary's PgBouncer, starting it on first use.
// Without a pgbouncer binary the test is skipped, and says so loudly (on
// stderr too, so it shows without -v); a pgbouncer that does not start
// fails it.
func Bouncer(tb testing.TB) *PgBouncer {
	tb.Helper()
	dsn := DSN(tb)
	bouncer.mu.Lock()
	defer bouncer.mu.Unlock()
	if bouncer.b == nil && bouncer.err == nil {
		bouncer.b, bouncer.err = startBouncer(dsn)
		if errors.Is(bouncer.err, errNoBouncer) {
			fmt.Fprintln(os.Stderr, "pgtest: "+bouncerInstall)
		}
	}
	switch {
	case errors.Is(bouncer.err, errNoBouncer):
		tb.Skip("pgtest: " + bouncerInstall)
	case bouncer.err != nil:
		tb.Fatalf("pgtest: pgbouncer: %v", bouncer.err)
	}
	return bouncer.b
}

var errNoBouncer = errors.New("no pgbouncer binary")

// bouncerBin finds pgbouncer on PATH or in /usr/sbin, where Debian puts it
// (not on a non-root PATH).
func bouncerBin() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", errNoBouncer
}

func startBouncer(dsn string) (*PgBouncer, error) {
	bin, err := bouncerBin()
	if err != nil {
		return nil, err
	}
	server, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtransport-pgbouncer-")
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{dir: dir, dbname: server.Database, user: server.User, server: server, exited: make(chan struct{})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	b.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	if strings.Trim(server.Database, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != "" {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("test database %q: only letters, digits and _ fit pgbouncer.ini unquoted", server.Database)
	}
	q := func(v string) string { // a value of pgbouncer's connection string
		return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
	}
	target := fmt.Sprintf("host=%s port=%d dbname=%s user=%s", q(server.Host), server.Port, q(server.Database), q(server.User))
	if server.Password != "" {
		target += " password=" + q(server.Password)
	}
	ini := fmt.Sprintf(`[databases]
%s = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 500
query_wait_timeout = 60
ignore_startup_parameters = extra_float_digits
logfile = %s
`, server.Database, target, b.port, filepath.Join(dir, "users.txt"), BouncerPoolSize, filepath.Join(dir, "pgbouncer.log"))
	users := fmt.Sprintf("%q \"\"\n", server.User)
	for name, text := range map[string]string{"pgbouncer.ini": ini, "users.txt": users} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	b.cmd = exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	b.cmd.Dir = dir
	b.cmd.Stdout, b.cmd.Stderr = &b.out, &b.out
	// Killed with this process, should it die before Shutdown.
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 { // pgbouncer will not run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root and there is no postgres user to run pgbouncer as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, p := range []string{dir, filepath.Join(dir, "pgbouncer.ini"), filepath.Join(dir, "users.txt")} {
			if err := os.Chown(p, uid, gid); err != nil {
				os.RemoveAll(dir)
				return nil, err
			}
		}
		b.cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	if err := b.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() { // owned by stop, which waits for exited
		_ = b.cmd.Wait()
		close(b.exited)
	}()
	if err := b.wait(10 * time.Second); err != nil {
		b.stop()
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "pgtest: started pgbouncer (transaction pooling, %d server connections) at 127.0.0.1:%d\n", BouncerPoolSize, b.port)
	return b, nil
}

// wait waits until pgbouncer answers a query, or it exits, or d passes.
func (b *PgBouncer) wait(d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-b.exited:
			return fmt.Errorf("pgbouncer exited: %s%s", b.out.String(), b.log())
		default:
		}
		if last = ping(b.DSN("simple_protocol")); last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("pgbouncer did not answer within %v: %w\n%s", d, last, b.log())
}

func (b *PgBouncer) log() string {
	text, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	return string(text)
}

// stop ends the process (SIGTERM: immediate shutdown; SIGKILL after 5 s)
// and removes its files.
func (b *PgBouncer) stop() {
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(5 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.exited
	}
	os.RemoveAll(b.dir)
}

// stopBouncer stops the test binary's PgBouncer, if one was started.
func stopBouncer() {
	bouncer.mu.Lock()
	defer bouncer.mu.Unlock()
	if bouncer.b != nil {
		bouncer.b.stop()
		bouncer.b = nil
	}
}

// DSN is a connection string through pgbouncer to the test database, with
// pgx's default_query_exec_mode set to mode ("" leaves pgx's default,
// cache_statement). It sets no search_path: pgbouncer refuses it as a
// startup parameter, so a transport through it names its schema
// (Config.Schema).
func (b *PgBouncer) DSN(mode string) string {
	dsn := fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", b.user, b.port, b.dbname)
	if mode != "" {
		dsn += "&default_query_exec_mode=" + mode
	}
	return dsn
}

// Pool returns a pool of up to maxConns (0 means 8) client connections
// through pgbouncer, with pgx's query exec mode mode (a DSN's name for it:
// exec, cache_describe, …; "" is pgx's default), whose connections name
// themselves app (their application_name, which pgbouncer hands on to the
// server connection each transaction runs on; "" means the harness's
// name). Closed in tb.Cleanup.
func (b *PgBouncer) Pool(tb testing.TB, maxConns int32, mode, app string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(b.DSN(mode))
	if err != nil {
		tb.Fatalf("pgtest: pgbouncer: %v", err)
	}
	if maxConns == 0 {
		maxConns = 8
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = cmp.Or(app, appName(owner))
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: pgbouncer pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// Reroute returns, in place of pool, a pool through pgbouncer of the same
// size with mode (as Pool), when pool goes straight to the test server;
// any other pool (a Proxy's) it returns as is. It runs a suite written
// against pgtest's pools through pgbouncer. The new pool has no
// search_path: pass the schema as Config.Schema.
func (b *PgBouncer) Reroute(tb testing.TB, pool *pgxpool.Pool, mode string) *pgxpool.Pool {
	tb.Helper()
	c := pool.Config().ConnConfig
	if c.Host != b.server.Host || c.Port != b.server.Port {
		return pool
	}
	return b.Pool(tb, pool.Config().MaxConns, mode, "")
}
