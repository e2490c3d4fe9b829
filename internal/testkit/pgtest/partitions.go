package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport/schema"
)

// Partitioned is one test's queue spread over partition databases behind a
// PL/Proxy proxy database, all on the test server: a fresh schema of one
// name in each (the queue, numbered, in every partition; the proxy's
// functions in the proxy), dropped when the test ends.
type Partitioned struct {
	Schema   string
	Proxy    *pgxpool.Pool   // on the proxy database; search_path is Schema
	Parts    []*pgxpool.Pool // Parts[i] on partition i's database; search_path is Schema
	ProxyDSN string
	PartDSNs []string
	cluster  *partCluster // the databases and their admin pools
	spare    *partCluster // Growable's: the shared cluster of twice as many, whose second half Grow adds
	maxConns int32
	fresh    []*snapshot // ReusedPartitions': each database's fresh state (the proxy's, then the partitions')
}

// Growable is Partitions(tb, n) behind a proxy database of tb's own, over
// the first n of the shared databases of a 2n-partition cluster: Grow
// adds the other n.
func Growable(tb testing.TB, n int) *Partitioned {
	tb.Helper()
	return forTest(tb, func() (*Partitioned, error) {
		shared, err := partitionCluster(2 * n)
		if err != nil {
			return nil, err
		}
		c, err := privateCluster(shared, nil, n)
		if err != nil {
			return nil, err
		}
		p, err := c.open(8)
		if err != nil {
			return nil, errors.Join(err, c.private())
		}
		p.spare = shared
		return p, nil
	})
}

// Grow grows a Growable p from n partitions to 2n as an operator does:
// Prepare, then schema.Grow through p's proxy.
func (p *Partitioned) Grow(ctx context.Context) (int, error) {
	added, err := p.Prepare(ctx)
	if err != nil {
		return 0, err
	}
	return schema.Grow(ctx, p.Proxy, p.Schema, added)
}

// Prepare readies a Growable p's n new partitions, as an operator does
// before growing: the queue applied and numbered n to 2n-1 in the next n
// shared databases (p.Parts and p.PartDSNs gain them). It returns their
// connection strings as the proxy's cluster lists partitions.
func (p *Partitioned) Prepare(ctx context.Context) ([]string, error) {
	n := len(p.Parts)
	if p.spare == nil || len(p.spare.parts) < 2*n {
		return nil, errors.New("pgtest: Prepare: not a Growable queue, or prepared already")
	}
	var added []string
	for i := n; i < 2*n; i++ {
		part, err := p.pool(ctx, p.spare.partDSNs[i], p.spare.parts[i])
		if err != nil {
			return nil, err
		}
		p.Parts, p.PartDSNs = append(p.Parts, part), append(p.PartDSNs, p.spare.partDSNs[i])
		p.cluster.parts = append(p.cluster.parts, p.spare.parts[i]) // dropped with the others
		if err := schema.Apply(ctx, part, p.Schema); err != nil {
			return nil, err
		}
		if err := schema.Partition(ctx, part, p.Schema, i); err != nil {
			return nil, err
		}
		added = append(added, p.spare.plproxy[i])
	}
	p.spare = nil
	return added, nil
}

// plproxyInstall says what a run without PL/Proxy needs.
const plproxyInstall = `no PL/Proxy on the test server: the partitioned tests are skipped.
Install it (Debian/Ubuntu: apt-get install postgresql-<server version>-plproxy; .ci/run does).`

// clusters are the partition and proxy databases this process has set up,
// by partition count: made once per server and kept (their schemas are the
// tests'), so processes share them.
var clusters struct {
	mu   stdsync.Mutex
	byN  map[int]*partCluster
	errs map[int]error
}

type partCluster struct {
	proxyDSN string
	partDSNs []string      // for the tests' pools: with the user
	plproxy  []string      // the cluster's options: without it, PL/Proxy connects as the calling role
	proxy    *pgxpool.Pool // admin pools: schemas are made and dropped here
	parts    []*pgxpool.Pool
	private  func() error // PartitionsOn's: drops its proxy database, closes its pools
}

// Partitions returns a fresh queue over n partitions (a power of two) for
// tb. Without PL/Proxy on the server the test is skipped, loudly (on stderr
// too); any other failure fails it.
func Partitions(tb testing.TB, n int) *Partitioned {
	tb.Helper()
	return forTest(tb, func() (*Partitioned, error) { return OpenPartitions(n, 8) })
}

// forTest opens a queue over partitions for tb: skipped, loudly, without
// PL/Proxy; failed on any other error; dropped when tb ends.
func forTest(tb testing.TB, open func() (*Partitioned, error)) *Partitioned {
	tb.Helper()
	DSN(tb)
	p, err := open()
	if errors.Is(err, ErrNoPLProxy) {
		fmt.Fprintln(os.Stderr, "pgtest: "+plproxyInstall)
		tb.Skip("pgtest: " + plproxyInstall)
	}
	if err != nil {
		tb.Fatalf("pgtest: partitions: %v", err)
	}
	tb.Cleanup(func() {
		if err := p.Drop(); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return p
}

// OpenPartitions is Partitions for programs (the benchmark runner), with
// pools of up to maxConns connections: the caller drops the schemas with
// Drop. Without PL/Proxy on the server it fails with ErrNoPLProxy.
func OpenPartitions(n int, maxConns int32) (*Partitioned, error) {
	c, err := partitionCluster(n)
	if err != nil {
		return nil, err
	}
	return c.open(maxConns)
}

// Drop closes p's pools and drops its schema in every database (and a
// private cluster's own proxy database and admin pools, PartitionsOn's).
func (p *Partitioned) Drop() error {
	err := p.cluster.drop(p)
	if p.cluster.private != nil {
		err = errors.Join(err, p.cluster.private())
	}
	return err
}

// PartitionsOn is Partitions(tb, n) with partition i in the database
// own[i] names, where given (a database the test owns, such as one on a
// throwaway cluster it restarts; the connection string names its user, as
// PL/Proxy connects with it), the others in the shared partition
// databases, and the proxy in a database of the test's own (its cluster
// lists these partitions), dropped at the end.
func PartitionsOn(tb testing.TB, n int, own map[int]string) *Partitioned {
	tb.Helper()
	return forTest(tb, func() (*Partitioned, error) {
		shared, err := partitionCluster(n)
		if err != nil {
			return nil, err
		}
		c, err := privateCluster(shared, own, n)
		if err != nil {
			return nil, err
		}
		p, err := c.open(8)
		if err != nil {
			return nil, errors.Join(err, c.private())
		}
		return p, nil
	})
}

// PartitionServer starts a throwaway cluster for tb to hold a partition
// it restarts (PartitionsOn), stopped and removed when tb ends. The proxy,
// on the test server, connects to it at 127.0.0.1, so tb is skipped when
// the test server is on another machine; failing to start fails it.
func PartitionServer(tb testing.TB) *Cluster {
	tb.Helper()
	if cfg, err := pgx.ParseConfig(DSN(tb)); err != nil ||
		!(cfg.Host == "127.0.0.1" || cfg.Host == "localhost" || cfg.Host == "::1" || strings.HasPrefix(cfg.Host, "/")) {
		tb.Skip("needs a test server on this machine: the proxy connects to a throwaway cluster at 127.0.0.1")
	}
	c, err := StartCluster()
	if err != nil {
		tb.Fatalf("throwaway cluster: %v", err)
	}
	tb.Cleanup(c.Stop)
	return c
}

// privateProxyPrefix starts the name of a private proxy database, which
// goes on with its maker's owner name: sweepProxies drops those of makers
// that are gone.
const privateProxyPrefix = "pgtransport_test_proxy_"

// sweepProxies drops the private proxy databases whose maker has no
// connection left on the server (killed before its cleanup ran).
func sweepProxies(ctx context.Context, adm *pgxpool.Pool) error {
	rows, err := adm.Query(ctx, `
		SELECT d.datname FROM pg_database AS d
		 WHERE d.datname LIKE $1 || '%'
		   AND NOT EXISTS (SELECT 1 FROM pg_stat_activity AS a
		                    WHERE a.application_name = 'pgtest ' || split_part(substr(d.datname, length($1) + 1), '_', 1))`,
		privateProxyPrefix)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		if _, err := adm.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// privateCluster is shared's first n partitions, with the partitions own
// names instead, and a proxy database of its own whose cluster lists
// them.
func privateCluster(shared *partCluster, own map[int]string, n int) (_ *partCluster, err error) {
	dsn, adm, err := server()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := privateProxyPrefix + owner + "_" + hex.EncodeToString(b[:])
	if err := locked(ctx, adm, func(conn *pgxpool.Conn) error { return createDatabases(ctx, conn, name) }); err != nil {
		return nil, err
	}
	c := &partCluster{partDSNs: slices.Clone(shared.partDSNs[:n]), plproxy: slices.Clone(shared.plproxy[:n]), parts: slices.Clone(shared.parts[:n])}
	var mine []*pgxpool.Pool
	c.private = func() error {
		for _, p := range mine {
			p.Close()
		}
		if c.proxy != nil {
			c.proxy.Close()
		}
		_, err := adm.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.private())
		}
	}()
	for i, d := range own {
		p, err := open(d, 4)
		if err != nil {
			return nil, err
		}
		mine = append(mine, p)
		cfg, err := pgx.ParseConfig(d)
		if err != nil {
			return nil, err
		}
		c.partDSNs[i], c.plproxy[i], c.parts[i] = connString(cfg, true), connString(cfg, true), p
	}
	base, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	base.Database = name
	c.proxyDSN = connString(base, true)
	if c.proxy, err = open(c.proxyDSN, 4); err != nil {
		return nil, err
	}
	return c, c.defineCluster(ctx)
}

// ErrNoPLProxy: the test server has no PL/Proxy to install.
var ErrNoPLProxy = errors.New("no plproxy extension on the server")

func partitionCluster(n int) (*partCluster, error) {
	clusters.mu.Lock()
	defer clusters.mu.Unlock()
	if c := clusters.byN[n]; c != nil {
		return c, nil
	}
	if err := clusters.errs[n]; err != nil {
		return nil, err
	}
	c, err := setUpCluster(n)
	if clusters.byN == nil {
		clusters.byN, clusters.errs = map[int]*partCluster{}, map[int]error{}
	}
	if err != nil {
		clusters.errs[n] = err
		return nil, err
	}
	clusters.byN[n] = c
	return c, nil
}

// setUpCluster creates (if absent) n partition databases and a proxy
// database with the plproxy extension and cluster pgtransport over them,
// under setUpLock.
func setUpCluster(n int) (_ *partCluster, err error) {
	dsn, adm, err := server()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var available bool
	if err := adm.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'plproxy')`).Scan(&available); err != nil {
		return nil, err
	}
	if !available {
		return nil, ErrNoPLProxy
	}
	base, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	c := &partCluster{}
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("pgtransport_test_%dparts_p%d", n, i)
	}
	proxyName := fmt.Sprintf("pgtransport_test_%dparts_proxy", n)
	err = locked(ctx, adm, func(conn *pgxpool.Conn) error {
		if err := createDatabases(ctx, conn, append(names, proxyName)...); err != nil {
			return err
		}
		return c.setUp(ctx, base, names, proxyName)
	})
	if err != nil {
		c.close()
		return nil, err
	}
	for _, p := range append([]*pgxpool.Pool{c.proxy}, c.parts...) {
		if _, err := sweep(ctx, p, time.Now()); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		}
	}
	if err := sweepProxies(ctx, adm); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: sweep proxy databases: %v\n", err)
	}
	return c, nil
}

// setUpLock is the server-wide advisory lock the test processes take to
// create databases and define the shared clusters ("pgtp", as schema's
// apply lock; the second key differs): several packages' tests run at
// once, and two CREATE SERVERs of one cluster would collide.
const setUpLock = 0x70677470

// locked runs f on a connection of adm holding setUpLock.
func locked(ctx context.Context, adm *pgxpool.Pool, f func(*pgxpool.Conn) error) (err error) {
	conn, err := adm.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1, -1)`, setUpLock); err != nil {
		return err
	}
	defer func() {
		_, uerr := conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1, -1)`, setUpLock)
		err = errors.Join(err, uerr)
	}()
	return f(conn)
}

// createDatabases creates the databases names that do not exist yet.
func createDatabases(ctx context.Context, conn *pgxpool.Conn, names ...string) error {
	for _, name := range names {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "42P04" { // duplicate_database
				return fmt.Errorf("create database %s: %w", name, err)
			}
		}
	}
	return nil
}

// setUp points c at the shared partition databases names and proxy
// database proxyName (pools, connection strings) and defines its cluster.
func (c *partCluster) setUp(ctx context.Context, base *pgx.ConnConfig, names []string, proxyName string) (err error) {
	dbDSN := func(db string, withUser bool) string {
		cfg := base.Copy()
		cfg.Database = db
		return connString(cfg, withUser)
	}
	for _, name := range names {
		c.partDSNs = append(c.partDSNs, dbDSN(name, true))
		c.plproxy = append(c.plproxy, dbDSN(name, false))
	}
	c.proxyDSN = dbDSN(proxyName, true)
	for _, d := range c.partDSNs {
		p, err := open(d, 4)
		if err != nil {
			return err
		}
		c.parts = append(c.parts, p)
	}
	if c.proxy, err = open(c.proxyDSN, 4); err != nil {
		return err
	}
	return c.defineCluster(ctx)
}

// defineCluster creates (or points at c's partitions) the proxy
// database's plproxy extension, cluster pgtransport and a user mapping.
// The options are quoted by format's %L, never spliced in here.
func (c *partCluster) defineCluster(ctx context.Context) error {
	if _, err := c.proxy.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS plproxy`); err != nil {
		return err
	}
	// Left alone when it lists these partitions already: an ALTER SERVER
	// makes every proxy backend reconnect, and races other processes'
	// grants on the server row.
	var same bool
	if err := c.proxy.QueryRow(ctx, `
		SELECT COALESCE((SELECT array_agg(o.option_value ORDER BY substr(o.option_name, 2)::INT)
		                   FROM pg_foreign_server AS s, pg_options_to_table(s.srvoptions) AS o
		                  WHERE s.srvname = 'pgtransport' AND o.option_name ~ '^p[0-9]+$') = $1::TEXT[], false)`, c.plproxy).Scan(&same); err != nil {
		return err
	}
	var ddl string
	if same {
		ddl = `SELECT 1`
	} else if err := c.proxy.QueryRow(ctx, `
		SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_foreign_server WHERE srvname = 'pgtransport')
		            THEN 'ALTER SERVER pgtransport OPTIONS (' || string_agg(format('SET p%s %L', t.i - 1, t.c), ', ' ORDER BY t.i) || ')'
		            ELSE 'CREATE SERVER pgtransport FOREIGN DATA WRAPPER plproxy OPTIONS (' || string_agg(format('p%s %L', t.i - 1, t.c), ', ' ORDER BY t.i) || ')'
		       END
		  FROM unnest($1::TEXT[]) WITH ORDINALITY AS t(c, i)`, c.plproxy).Scan(&ddl); err != nil {
		return err
	}
	for _, q := range []string{ddl, `CREATE USER MAPPING IF NOT EXISTS FOR PUBLIC SERVER pgtransport`} {
		if _, err := c.proxy.Exec(ctx, q); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	return nil
}

// connString is cfg as a keyword/value connection string, for PL/Proxy's
// libpq: host, port, database, password and (withUser) user, each quoted.
// Without a user PL/Proxy connects as the calling role, as
// TestProxyLeastPrivilege needs.
func connString(cfg *pgx.ConnConfig, withUser bool) string {
	q := func(v string) string {
		out := []byte{'\''}
		for i := 0; i < len(v); i++ {
			if v[i] == '\'' || v[i] == '\\' {
				out = append(out, '\\')
			}
			out = append(out, v[i])
		}
		return string(append(out, '\''))
	}
	s := fmt.Sprintf("host=%s port=%d dbname=%s", q(cfg.Host), cfg.Port, q(cfg.Database))
	if withUser {
		s += " user=" + q(cfg.User)
	}
	if cfg.Password != "" {
		s += " password=" + q(cfg.Password)
	}
	return s
}

func (c *partCluster) close() {
	for _, p := range c.parts {
		p.Close()
	}
	if c.proxy != nil {
		c.proxy.Close()
	}
}

// open makes a fresh schema in every database: the queue in each partition
// (applied and numbered), the proxy's functions in the proxy (applied last:
// it checks the partitions).
func (c *partCluster) open(maxConns int32) (_ *Partitioned, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var b [6]byte
	_, _ = rand.Read(b[:])
	p := &Partitioned{Schema: "t_" + hex.EncodeToString(b[:]), ProxyDSN: c.proxyDSN, PartDSNs: slices.Clone(c.partDSNs), cluster: c, maxConns: maxConns}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.drop(p))
		}
	}()
	for i, adm := range c.parts {
		part, err := p.pool(ctx, c.partDSNs[i], adm)
		if err != nil {
			return p, err
		}
		p.Parts = append(p.Parts, part)
		if err := schema.Apply(ctx, part, p.Schema); err != nil {
			return p, err
		}
		if err := schema.Partition(ctx, part, p.Schema, i); err != nil {
			return p, err
		}
	}
	if p.Proxy, err = p.pool(ctx, c.proxyDSN, c.proxy); err != nil {
		return p, err
	}
	if err := schema.ApplyProxy(ctx, p.Proxy, p.Schema); err != nil {
		return p, err
	}
	return p, nil
}

// pool makes p's schema in the database adm is on and returns a pool of
// p's on it (dsn), its search_path on the schema.
func (p *Partitioned) pool(ctx context.Context, dsn string, adm *pgxpool.Pool) (*pgxpool.Pool, error) {
	if err := createSchema(ctx, adm, p.Schema, owner, time.Now()); err != nil {
		return nil, fmt.Errorf("create schema: %w", err)
	}
	return p.connectTo(ctx, dsn)
}

// connectTo returns a pool of p's on the database dsn names, its
// search_path on p's schema.
func (p *Partitioned) connectTo(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = p.maxConns
	cfg.ConnConfig.RuntimeParams["search_path"] = p.Schema
	cfg.ConnConfig.RuntimeParams["application_name"] = appName(owner)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// drop closes p's pools and drops its schema everywhere.
func (c *partCluster) drop(p *Partitioned) error {
	var errs []error
	for i, adm := range append([]*pgxpool.Pool{c.proxy}, c.parts...) {
		if i == 0 && p.Proxy != nil {
			p.Proxy.Close()
		} else if i > 0 && i <= len(p.Parts) && p.Parts[i-1] != nil {
			p.Parts[i-1].Close()
		}
		if _, err := adm.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{p.Schema}.Sanitize()+" CASCADE"); err != nil {
			errs = append(errs, fmt.Errorf("drop schema %s: %w", p.Schema, err))
		}
	}
	return errors.Join(errs...)
}

// stopPartitions closes the admin pools of the partition clusters.
func stopPartitions() {
	dropReused()
	clusters.mu.Lock()
	defer clusters.mu.Unlock()
	for _, c := range clusters.byN {
		c.close()
	}
	clusters.byN = nil
}
