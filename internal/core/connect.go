package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
)

// Connect opens a pool on dsn, of pgtransport.DefaultPoolSize connections
// at most unless dsn sets pool_max_conns (or pgx's default is larger), and
// waits until the server answers, retrying
// with exponential backoff (50 ms up to 2 s) until ctx ends or
// cfg.MaxConnectWait passes. The error then wraps both the reason it
// stopped and the last connection error. A malformed dsn fails at once. It
// returns cfg with its defaults filled in.
func Connect(ctx context.Context, dsn string, cfg pgtransport.Config) (*pgxpool.Pool, pgtransport.Config, error) {
	cfg, err := Defaults(cfg)
	if err != nil {
		return nil, cfg, err
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, cfg, fmt.Errorf("%w: dsn: %w", pgtransport.ErrInvalidConfig, err)
	}
	if !setsPoolSize(dsn) {
		pcfg.MaxConns = max(pcfg.MaxConns, pgtransport.DefaultPoolSize)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, cfg, fmt.Errorf("connect: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, cfg.MaxConnectWait)
	defer cancel()
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 50 * time.Millisecond
	b.MaxInterval = 2 * time.Second
	b.MaxElapsedTime = 0 // wctx bounds it
	var last error
	err = backoff.Retry(func() error {
		actx, cancel := context.WithTimeout(wctx, 5*time.Second)
		defer cancel()
		err := pool.Ping(actx)
		if err != nil && (last == nil || wctx.Err() == nil) {
			// An attempt begun as wctx ended fails with wctx's error
			// alone; the error worth reporting is the one before it.
			last = err
		}
		return err
	}, backoff.WithContext(b, wctx))
	if err != nil {
		pool.Close()
		if last != nil && !errors.Is(err, last) {
			return nil, cfg, fmt.Errorf("connect: gave up: %w (last error: %w)", err, last)
		}
		return nil, cfg, fmt.Errorf("connect: %w", err)
	}
	return pool, cfg, nil
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

// FromDSN is the front-ends' FromDSN: Connect, then open a transport on the
// pool, closing the pool if that fails. The caller owns the pool after.
func FromDSN[T any](ctx context.Context, dsn string, cfg pgtransport.Config, open func(*pgxpool.Pool, pgtransport.Config) (T, error)) (T, *pgxpool.Pool, error) {
	var zero T
	pool, cfg, err := Connect(ctx, dsn, cfg)
	if err != nil {
		return zero, nil, err
	}
	t, err := open(pool, cfg)
	if err != nil {
		pool.Close()
		return zero, nil, err
	}
	return t, pool, nil
}
