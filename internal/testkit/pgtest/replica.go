package pgtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	stdsync "sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Replicated is a throwaway primary and a hot standby streaming from it,
// each a Cluster of its own on 127.0.0.1, for failover tests: Kill stops
// the primary hard, Promote makes the standby the primary, and DSN names
// both hosts so that clients find whichever accepts writes.
type Replicated struct {
	Primary, Standby *Cluster
	ReplicaConfig
	link   *lagLink // between the standby and the primary, when Lag is set
	frozen []int    // the primary's processes, stopped by Freeze
}

// ReplicaConfig says how the standby follows the primary.
type ReplicaConfig struct {
	// Sync: commits on the primary wait until the standby has flushed
	// them (synchronous_standby_names = '*', synchronous_commit = on).
	// Else replication is asynchronous.
	Sync bool
	// Lag delays everything the primary sends the standby by this much
	// (a forwarder between them): the WAL of the last Lag before a Kill
	// never reaches the standby, as on a slow link to another zone.
	Lag time.Duration
}

// StartReplicated starts a primary (initdb), takes a base backup of it
// into a standby (pg_basebackup -R, so it streams from the primary),
// starts the standby as a hot standby and waits until it streams. With
// cfg.Sync, the primary's commits then wait for the standby (and
// StartReplicated waits until the standby is the synchronous one). Stop
// removes both.
func StartReplicated(cfg ReplicaConfig) (*Replicated, error) {
	primary, err := StartCluster()
	if err != nil {
		return nil, err
	}
	r := &Replicated{Primary: primary, ReplicaConfig: cfg}
	if err := r.startStandby(); err != nil {
		r.Stop()
		return nil, err
	}
	return r, nil
}

func (r *Replicated) startStandby() error {
	p := r.Primary
	s, err := newCluster(p.bin)
	if err != nil {
		return err
	}
	r.Standby = s
	// -X stream: the backup carries the WAL written while it ran; -R:
	// standby.signal and primary_conninfo, so it starts as a standby of p;
	// application_name names it in pg_stat_replication.
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=standby", p.port)
	if out, err := s.run("pg_basebackup", "-D", s.data(), "-d", conninfo, "-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		return fmt.Errorf("replicated cluster: pg_basebackup: %w\n%s", err, out)
	}
	if r.Lag > 0 { // stream through the link instead: a later line wins
		if r.link, err = startLag(fmt.Sprintf("127.0.0.1:%d", p.port), r.Lag); err != nil {
			return err
		}
		conninfo = fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=standby", r.link.port())
		if err := s.appendFile("postgresql.auto.conf", fmt.Sprintf("primary_conninfo = '%s'", conninfo)); err != nil {
			return err
		}
	}
	// The standby's own settings, which count once it is promoted: no
	// synchronous standby of its own (it has none: with the primary's
	// setting copied, every commit on the promoted server would wait for
	// ever).
	if err := s.appendConf("synchronous_standby_names = ''", "hot_standby = on"); err != nil {
		return err
	}
	if err := s.Start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.waitReplication(ctx, "async"); err != nil {
		return err
	}
	if !r.Sync {
		return nil
	}
	if err := p.appendConf("synchronous_standby_names = '*'", "synchronous_commit = on"); err != nil {
		return err
	}
	if out, err := p.run("pg_ctl", "-D", p.data(), "reload"); err != nil {
		return fmt.Errorf("replicated cluster: pg_ctl reload: %w\n%s", err, out)
	}
	return r.waitReplication(ctx, "sync")
}

// waitReplication waits until the primary sees the standby streaming, in
// the given sync_state.
func (r *Replicated) waitReplication(ctx context.Context, state string) error {
	var last error
	for ctx.Err() == nil {
		last = func() error {
			conn, err := pgx.Connect(ctx, r.Primary.DSN())
			if err != nil {
				return err
			}
			defer conn.Close(context.Background())
			var got string
			err = conn.QueryRow(ctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby' AND state = 'streaming'`).Scan(&got)
			if err != nil {
				return err
			}
			if got != state {
				return fmt.Errorf("standby is %s, want %s", got, state)
			}
			return nil
		}()
		if last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond) // kept: polling the server's view of replication
	}
	return fmt.Errorf("replicated cluster: the standby never streamed (%s): %w", state, last)
}

// DSN names both servers, the primary first, with
// target_session_attrs=read-write: a client connects to whichever accepts
// writes, so after a promotion it finds the new primary by itself.
func (r *Replicated) DSN() string {
	return fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write connect_timeout=5",
		r.Primary.port, r.Standby.port)
}

// Kill crashes the primary as a host dies: Freeze, then SIGKILL every
// process of the server and wait until they are gone (their connections
// are then reset, as by a host that reboots). The files stay. It returns
// when the server froze: it answered nothing after. Linux only (it reads
// /proc).
func (r *Replicated) Kill() (time.Time, error) {
	frozen, err := r.Freeze()
	if err != nil {
		return frozen, err
	}
	pids := r.frozen
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		alive := slices.ContainsFunc(pids, func(pid int) bool { return syscall.Kill(pid, 0) == nil && !zombie(pid) })
		if !alive {
			r.frozen = nil
			return frozen, nil
		}
		if time.Now().After(deadline) {
			return frozen, fmt.Errorf("replicated cluster: the primary's processes outlived SIGKILL")
		}
		time.Sleep(5 * time.Millisecond) // kept: waiting for the kernel to reap them
	}
}

// Freeze stops the primary dead without closing anything, as a host that
// hangs or drops off the network: it stops the postmaster and every
// process of the server (SIGSTOP), then cuts the link to the standby if
// there is one (what it holds back is lost). Its connections stay open
// and answer nothing; new ones are accepted by the kernel and then hang.
// It returns when the server froze. Stop (or Kill) ends the processes.
func (r *Replicated) Freeze() (time.Time, error) {
	pids, err := r.Primary.processes()
	if err != nil {
		return time.Time{}, err
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	// Children forked while the postmaster was being stopped.
	if more, err := r.Primary.processes(); err == nil {
		for _, pid := range more {
			if !slices.Contains(pids, pid) {
				_ = syscall.Kill(pid, syscall.SIGSTOP)
				pids = append(pids, pid)
			}
		}
	}
	frozen := time.Now()
	r.frozen = pids
	if r.link != nil {
		r.link.close()
	}
	return frozen, nil
}

// processes is the postmaster's pid (from postmaster.pid) and its
// children's, the postmaster first.
func (c *Cluster) processes() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(c.data(), "postmaster.pid"))
	if err != nil {
		return nil, fmt.Errorf("replicated cluster: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pm, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return nil, fmt.Errorf("replicated cluster: postmaster.pid: %w", err)
	}
	pids := []int{pm}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after
		// its closing parenthesis.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == pm {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(st)))
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// zombie reports whether pid has exited and waits to be reaped (a
// postmaster's children are, once it is dead, reaped by init).
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	return len(f) > 0 && f[0] == "Z"
}

// Promote promotes the standby and waits until it accepts writes.
func (r *Replicated) Promote() error {
	s := r.Standby
	out, err := s.run("pg_ctl", "-D", s.data(), "-w", "-t", "60", "promote")
	if err != nil {
		return fmt.Errorf("replicated cluster: pg_ctl promote: %w\n%s", err, out)
	}
	return nil
}

// Stop stops both servers (whichever still runs) and removes their files.
func (r *Replicated) Stop() {
	if r.link != nil {
		r.link.close()
	}
	for _, pid := range r.frozen { // a frozen primary would never stop
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if r.Standby != nil {
		r.Standby.Stop()
	}
	r.Primary.Stop()
}

// HaveReplicationBinaries reports why a replicated cluster cannot be
// started here ("" when it can): the server binaries initdb, pg_ctl and
// pg_basebackup must be installed.
func HaveReplicationBinaries() string {
	bin, err := findBin()
	if err != nil {
		return err.Error()
	}
	var missing []string
	for _, name := range []string{"initdb", "pg_ctl", "pg_basebackup"} {
		if _, err := os.Stat(filepath.Join(bin, name)); err != nil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return fmt.Sprintf("no %s in %s", strings.Join(missing, ", "), bin)
	}
	return ""
}

// newCluster is a Cluster with its directory (owned by the postgres user
// when the process is root) and a free port, and no data yet.
func newCluster(bin string) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "pgtransport-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		if err := chownPostgres(dir); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		c.asUser = "postgres"
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	return c, nil
}

// appendConf appends settings to the cluster's postgresql.conf (a later
// line wins over an earlier one).
func (c *Cluster) appendConf(lines ...string) error {
	return c.appendFile("postgresql.conf", lines...)
}

// appendFile appends lines to a file of the cluster's data directory.
func (c *Cluster) appendFile(name string, lines ...string) error {
	f, err := os.OpenFile(filepath.Join(c.data(), name), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString("\n" + strings.Join(lines, "\n") + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// chownPostgres gives dir to the postgres user, who runs the binaries when
// the process is root.
func chownPostgres(dir string) error {
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("replicated cluster: running as root and there is no postgres user to run the server as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(dir, uid, gid)
}

// lagLink forwards TCP connections to target, delaying what target sends
// back by lag; what the client sends goes through at once.
type lagLink struct {
	l      net.Listener
	target string
	lag    time.Duration
	done   chan struct{} // closed by close
	once   stdsync.Once
	wg     stdsync.WaitGroup
}

func startLag(target string, lag time.Duration) (*lagLink, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	k := &lagLink{l: l, target: target, lag: lag, done: make(chan struct{})}
	k.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			k.wg.Go(func() { k.serve(c) })
		}
	})
	return k, nil
}

func (k *lagLink) port() int { return k.l.Addr().(*net.TCPAddr).Port }

// close cuts every connection at once, dropping what is held back, and
// waits for the link's goroutines.
func (k *lagLink) close() {
	k.once.Do(func() {
		close(k.done)
		k.l.Close()
	})
	k.wg.Wait()
}

func (k *lagLink) serve(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", k.target)
	if err != nil {
		return
	}
	defer server.Close()
	type chunk struct {
		b  []byte
		at time.Time
	}
	held := make(chan chunk, 4096)
	stop := make(chan struct{})
	var wg stdsync.WaitGroup
	defer wg.Wait()
	defer close(stop)
	wg.Go(func() { // upstream, undelayed
		_, _ = io.Copy(server, client)
		server.Close()
	})
	wg.Go(func() { // downstream, read as it comes and held back
		defer close(held)
		for {
			b := make([]byte, 32<<10)
			n, err := server.Read(b)
			if n > 0 {
				select {
				case held <- chunk{b[:n], time.Now().Add(k.lag)}:
				case <-stop:
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	wg.Go(func() { // at close, or when serve returns, cut both ends
		select {
		case <-k.done:
		case <-stop:
		}
		client.Close()
		server.Close()
	})
	for c := range held {
		t := time.NewTimer(time.Until(c.at))
		select {
		case <-t.C:
		case <-k.done:
			t.Stop()
			return
		}
		if _, err := client.Write(c.b); err != nil {
			return
		}
	}
}

func (c ReplicaConfig) String() string {
	s := "asynchronous replication"
	if c.Sync {
		s = "synchronous replication"
	}
	if c.Lag > 0 {
		s += fmt.Sprintf(", WAL delayed by %v", c.Lag)
	}
	return s
}
