package pgtest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Cluster is a throwaway PostgreSQL cluster in a temporary directory,
// listening on 127.0.0.1 at a free port. Tests that own it may restart it.
type Cluster struct {
	dir, bin string
	port     int
	asUser   string // run the binaries as this user (root may not run them)
}

// StartCluster initializes and starts a cluster from the installed server
// binaries, with PostgreSQL's defaults but for settings ("name=value",
// e.g. "shared_buffers=2GB"), written to its postgresql.auto.conf.
func StartCluster(settings ...string) (*Cluster, error) {
	conf, err := confLines(settings)
	if err != nil {
		return nil, err
	}
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtransport-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("throwaway cluster: running as root and there is no postgres user to run initdb as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
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
	if out, err := c.run("initdb", "-D", c.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("throwaway cluster: initdb: %w\n%s", err, out)
	}
	if err := c.configure(conf); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := c.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return c, nil
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

// confLines is settings ("name=value") as lines of postgresql.auto.conf,
// each value quoted as the server's files quote it.
func confLines(settings []string) (string, error) {
	var b strings.Builder
	for _, s := range settings {
		name, value, ok := strings.Cut(s, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.ContainsAny(name, " \t\n'#=") {
			return "", fmt.Errorf("throwaway cluster: setting %q is not name=value", s)
		}
		if strings.ContainsAny(value, "\r\n") {
			return "", fmt.Errorf("throwaway cluster: setting %q has a line break in its value", s)
		}
		fmt.Fprintf(&b, "%s = '%s'\n", name, strings.ReplaceAll(strings.TrimSpace(value), "'", "''"))
	}
	return b.String(), nil
}

// configure appends conf to the cluster's postgresql.auto.conf.
func (c *Cluster) configure(conf string) error {
	if conf == "" {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(c.data(), "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(conf); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// DSN is the cluster's connection string.
func (c *Cluster) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Start starts the (stopped) cluster and waits until it accepts connections.
func (c *Cluster) Start() error {
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=200", c.port, c.dir)
	out, err := c.run("pg_ctl", "-D", c.data(), "-o", opts, "-l", filepath.Join(c.dir, "log"), "-w", "-t", "60", "start")
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "log"))
		return fmt.Errorf("throwaway cluster: pg_ctl start: %w\n%s\n%s", err, out, log)
	}
	return nil
}

// StopKeep stops the cluster (fast shutdown: connections are cut) and keeps
// its files, so Start brings it back with its data.
func (c *Cluster) StopKeep() error {
	out, err := c.run("pg_ctl", "-D", c.data(), "-m", "fast", "-w", "stop")
	if err != nil {
		return fmt.Errorf("throwaway cluster: pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

// Stop stops the cluster and removes its files.
func (c *Cluster) Stop() {
	_ = c.StopKeep()
	os.RemoveAll(c.dir)
}

func (c *Cluster) run(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	path := filepath.Join(c.bin, name)
	var cmd *exec.Cmd
	if c.asUser != "" {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", c.asUser, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = c.dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// findBin finds the directory of initdb and pg_ctl: pg_config --bindir, the
// newest /usr/lib/postgresql/*/bin, or PATH.
func findBin() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("throwaway cluster: no initdb found (pg_config --bindir, /usr/lib/postgresql/*/bin, PATH)")
}

// CPU is the processor time the cluster's processes have used so far (user
// and system; Linux, from /proc): the postmaster's, its children's, and
// that of children it has reaped. For benchmarks on a machine whose other
// load would skew its wall-clock figures.
func (c *Cluster) CPU() (time.Duration, error) {
	pids, err := c.processes()
	if err != nil {
		return 0, err
	}
	var ticks uint64
	for i, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // gone meanwhile
		}
		// After "pid (comm) ": state is field 0, utime 11, stime 12,
		// cutime 13, cstime 14 (proc(5) numbers them from 3).
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		last := 12
		if i == 0 {
			last = 14 // the postmaster's reaped children too
		}
		if len(f) <= last {
			continue
		}
		for _, v := range f[11 : last+1] {
			n, _ := strconv.ParseUint(v, 10, 64)
			ticks += n
		}
	}
	return time.Duration(ticks) * time.Second / 100, nil // USER_HZ
}
