package cluster

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
)

// Connect opens a pool on dsn, of pgtransport.DefaultPoolSize connections
// at most unless dsn sets pool_max_conns (or pgx's default is larger), and
// waits until the server answers, retrying
// with exponential backoff (50 ms up to 2 s) until ctx ends or
// cfg.MaxConnectWait passes. The error then wraps both the reason it
// stopped and the last connection error. A malformed dsn fails at once. It
// returns cfg with its defaults filled in.
func Connect(ctx context.Context, dsn string, cfg pgtransport.Config) (*pgxpool.Pool, pgtransport.Config, error) {
	cfg, err := core.Defaults(cfg)
	if err != nil {
		return nil, cfg, err
	}
	pcfg, err := parseDSN(dsn)
	if err != nil {
		return nil, cfg, err
	}
	pool, err := connectPool(ctx, pcfg, cfg)
	return pool, cfg, err
}

// parseDSN is dsn's pool configuration, pgtransport.DefaultPoolSize
// connections at most unless dsn sets pool_max_conns (or pgx's default is
// larger).
func parseDSN(dsn string) (*pgxpool.Config, error) {
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: dsn: %w", pgtransport.ErrInvalidConfig, err)
	}
	if !setsPoolSize(dsn) {
		pcfg.MaxConns = max(pcfg.MaxConns, pgtransport.DefaultPoolSize)
	}
	return pcfg, nil
}

// connectPool opens a pool on pcfg and waits until the server answers, as
// Connect says; cfg has its defaults. Only what can heal is retried
// (heals); a cause is logged the first time its kind is seen. ctx's end is
// the caller's and is returned as such; the end of cfg.MaxConnectWait is
// ErrUnreachable, never a deadline of the caller's.
func connectPool(ctx context.Context, pcfg *pgxpool.Config, cfg pgtransport.Config) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := waitFor(ctx, pool, cfg); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// waitFor pings pool until the server answers, as connectPool says.
func waitFor(ctx context.Context, pool *pgxpool.Pool, cfg pgtransport.Config) error {
	giveUp := time.Now().Add(cfg.MaxConnectWait)
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 50 * time.Millisecond
	b.MaxInterval = 2 * time.Second
	b.MaxElapsedTime = 0 // giveUp bounds it
	logged := map[string]bool{}
	log := cmp.Or(cfg.Logger, slog.Default())
	var last error // the last attempt's error, or the one before an attempt cut short by the wait's end
	for {
		actx, cancel := context.WithTimeout(ctx, min(time.Until(giveUp), 5*time.Second))
		err := pool.Ping(actx)
		cancel()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("connect: %w (last error: %w)", ctx.Err(), cmp.Or(last, err))
		}
		kind, ok := heals(err)
		if !ok {
			return fmt.Errorf("connect: %w%s", err, connectHint(err))
		}
		if last == nil || !errors.Is(err, context.DeadlineExceeded) {
			last = err
		}
		left := time.Until(giveUp)
		if left <= 0 {
			return fmt.Errorf("connect: %w: gave up after %v (Config.MaxConnectWait): %w", pgtransport.ErrUnreachable, cfg.MaxConnectWait, last)
		}
		if !logged[kind] {
			logged[kind] = true
			log.Warn("pgtransport: connect: the database does not accept connections yet; retrying", "err", err, "gives_up_in", left.Round(time.Second))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("connect: %w (last error: %w)", ctx.Err(), last)
		case <-time.After(min(b.NextBackOff(), left)):
		}
	}
}

// heals reports whether a failed connect may succeed if tried again, and
// names the kind of its cause (for logging each kind once): the server
// refusing for now (starting up or shutting down, too many connections,
// out of resources), the network (refused, reset, timed out, a host
// name not resolvable yet, as while a compose service starts). A server
// that answers with any other refusal (a database or role that does not
// exist, a wrong password, a role that may not connect), or a TLS
// certificate that does not verify, will refuse again: it does not heal.
func heals(err error) (kind string, ok bool) {
	if pgErr, isPg := errors.AsType[*pgconn.PgError](err); isPg {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03", // shutting down, crashed, starting up
			"53000", "53100", "53200", "53300", "53400", // out of resources, too many connections
			"08000", "08001", "08004", "08006": // connection exceptions
			return pgErr.Code, true
		}
		return pgErr.Code, false
	}
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
	)
	if errors.As(err, &unknownCA) || errors.As(err, &hostname) || errors.As(err, &invalid) {
		return "tls", false
	}
	if _, isDNS := errors.AsType[*net.DNSError](err); isDNS {
		return "dns", true
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return "refused", true
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout", true
	}
	return "network", true
}

// connectHint is what to do about a connect refusal that does not heal.
func connectHint(err error) string {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	if !ok {
		return ""
	}
	switch pgErr.Code {
	case "3D000":
		return ": not retried: create the database, or fix the connection string's database name"
	case "28000":
		return ": not retried: create the role (or let it log in), or fix the connection string's user"
	case "28P01":
		return ": not retried: fix the password (the connection string, PGPASSWORD or the password file)"
	case "42501":
		return ": not retried: the role may not connect to this database (GRANT CONNECT ON DATABASE … TO …)"
	}
	return ": not retried (the server would refuse again)"
}

// setsPoolSize reports whether dsn, which pgxpool.ParseConfig accepted,
// names the pool's size (pool_max_conns). pgxpool removes the setting as
// it reads it, so it is looked for in a parse of its own.
func setsPoolSize(dsn string) bool {
	c, err := pgx.ParseConfig(dsn)
	if err != nil {
		return false
	}
	_, ok := c.RuntimeParams["pool_max_conns"]
	return ok
}

// mapSQL reads a proxy's partition map: harel_px_parts() refuses a cluster
// the proxy was not checked against (schema.ApplyProxy) or that changed
// since, and the options p0 ... pN-1 of the foreign server pgtransport
// are the partitions' connection strings, in order. {s} is the schema.
const mapSQL = `SELECT {s}harel_px_parts(),
       (SELECT array_agg(o.option_value ORDER BY substr(o.option_name, 2)::INT)
          FROM pg_foreign_server AS s, pg_options_to_table(s.srvoptions) AS o
         WHERE s.srvname = 'pgtransport' AND o.option_name ~ '^p[0-9]+$')`

// ConnectCluster reads the partition map of the PL/Proxy proxy at
// proxyDSN (its cluster pgtransport, in the schema cfg.Schema names,
// checked by schema.ApplyProxy) and connects to each partition, as
// Connect does (retrying until cfg.MaxConnectWait), returning pools[i] on
// partition i. Each partition is reached as the proxy was: its connection
// string (which, as PL/Proxy's, names no role) with proxyDSN's role,
// its password unless the string has one, its session settings (the
// string's win) and its pool size. A proxy whose cluster changed since it
// was checked, or a database that is no proxy, is ErrInvalidConfig. The
// caller owns the pools.
func ConnectCluster(ctx context.Context, proxyDSN string, cfg pgtransport.Config) ([]*pgxpool.Pool, pgtransport.Config, error) {
	cfg, err := core.Defaults(cfg)
	if err != nil {
		return nil, cfg, err
	}
	pcfg, err := parseDSN(proxyDSN)
	if err != nil {
		return nil, cfg, err
	}
	dsns, err := readMap(ctx, pcfg.Copy(), cfg)
	if err != nil {
		return nil, cfg, err
	}
	cfgs := make([]*pgxpool.Config, len(dsns))
	for i, dsn := range dsns {
		if cfgs[i], err = partitionConfig(dsn, pcfg); err != nil {
			return nil, cfg, fmt.Errorf("%w: the connection string of partition p%d: %w", pgtransport.ErrInvalidConfig, i, err)
		}
	}
	pools := make([]*pgxpool.Pool, len(dsns))
	errs := make([]error, len(dsns))
	each(allOf(len(dsns)), func(i int) { // at once: MaxConnectWait bounds them all
		if pools[i], errs[i] = connectPool(ctx, cfgs[i], cfg); errs[i] != nil {
			errs[i] = fmt.Errorf("partition p%d: %w", i, errs[i])
		}
	})
	if err := errors.Join(errs...); err != nil {
		for _, p := range pools {
			if p != nil {
				p.Close()
			}
		}
		return nil, cfg, err
	}
	return pools, cfg, nil
}

// partitionConfig is the pool configuration for a partition's connection
// string dsn (the cluster's option), reached as the proxy's configuration
// pcfg is: with its role, as PL/Proxy appends user= to the string (before
// the string is read, so a password file is looked up for that role), its
// password unless the string or the password file gives one, its session
// settings where the string sets none, its query exec mode and statement
// caches, and its pool size. TLS is the string's to set, as for PL/Proxy.
func partitionConfig(dsn string, pcfg *pgxpool.Config) (*pgxpool.Config, error) {
	uri := strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
	if !uri {
		user := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pcfg.ConnConfig.User)
		dsn += " user='" + user + "'"
	}
	c, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	c.ConnConfig.User = pcfg.ConnConfig.User
	if c.ConnConfig.Password == "" {
		c.ConnConfig.Password = pcfg.ConnConfig.Password
	}
	for k, v := range pcfg.ConnConfig.RuntimeParams {
		if _, ok := c.ConnConfig.RuntimeParams[k]; !ok {
			c.ConnConfig.RuntimeParams[k] = v
		}
	}
	c.MaxConns, c.MinConns = pcfg.MaxConns, pcfg.MinConns
	// pgx reads these out of the settings into fields (libpq, and so a
	// PL/Proxy connection string, has no such keywords): a proxy DSN's
	// default_query_exec_mode=exec, for partitions behind a transaction
	// pooler, reaches them here.
	c.ConnConfig.DefaultQueryExecMode = pcfg.ConnConfig.DefaultQueryExecMode
	c.ConnConfig.StatementCacheCapacity = pcfg.ConnConfig.StatementCacheCapacity
	c.ConnConfig.DescriptionCacheCapacity = pcfg.ConnConfig.DescriptionCacheCapacity
	return c, nil
}

// readMap reads the partition map through one connection to the proxy.
func readMap(ctx context.Context, pcfg *pgxpool.Config, cfg pgtransport.Config) ([]string, error) {
	pcfg.MaxConns, pcfg.MinConns = 1, 0
	proxy, err := connectPool(ctx, pcfg, cfg)
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	defer proxy.Close()
	prefix := ""
	if cfg.Schema != "" {
		prefix = pgx.Identifier{cfg.Schema}.Sanitize() + "."
	}
	var (
		n    int
		dsns []string
	)
	err = proxy.QueryRow(ctx, strings.ReplaceAll(mapSQL, "{s}", prefix)).Scan(&n, &dsns)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && (pgErr.Code == "22023" || pgErr.Code == "42883") {
		if pgErr.Code == "42883" {
			where := "the connection's current schema (Config.Schema is empty)"
			if cfg.Schema != "" {
				where = fmt.Sprintf("schema %q (Config.Schema)", cfg.Schema)
			}
			return nil, fmt.Errorf("%w: no proxy in %s: set Config.Schema to the schema the proxy was set up in (schema.ApplyProxy, pgtransport migrate apply --proxy --schema): %s",
				pgtransport.ErrInvalidConfig, where, pgErr.Message)
		}
		if pgErr.Hint != "" {
			return nil, fmt.Errorf("%w: %s (%s)", pgtransport.ErrInvalidConfig, pgErr.Message, pgErr.Hint)
		}
		return nil, fmt.Errorf("%w: %s", pgtransport.ErrInvalidConfig, pgErr.Message)
	}
	if err != nil {
		return nil, core.MapErr("read the partition map", err)
	}
	if len(dsns) != n {
		return nil, fmt.Errorf("%w: the proxy counts %d partitions, its cluster lists %d", pgtransport.ErrInvalidConfig, n, len(dsns))
	}
	return dsns, nil
}
