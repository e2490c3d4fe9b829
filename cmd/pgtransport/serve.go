package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgtransport/pgtransport/cmd/pgtransport/dashboard"
)

func (a *app) serveCmd() *cobra.Command {
	var (
		addr     string
		actions  bool
		interval time.Duration
		window   time.Duration
		hosts    []string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve a live dashboard of the queue in the browser",
		Long: `serve runs a web dashboard of the queue on --addr (default 127.0.0.1:8080:
this machine only):

  Overview      depth, groups by state, oldest head, dead letters, and a live
                chart of published and acked per second and of depth
  Groups        the stuck-first lists (oldest heads, held longest, most
                attempts, parked, stopped, paused), 50 a page; a group's page
                with its holder and next messages
  Dead letters  a page of them; one in detail

It is read-only unless --allow-actions: then a group can be paused, resumed
or purged and a dead letter redriven or deleted, each after a confirmation
page, by a POST that carries the server's token and comes from the
dashboard's own pages (cross-site requests are refused).

One sampler reads Stats every --interval however many pages are open (about
0.2 s at a million groups). Requests must
name the server by an IP address or localhost, or a name given with --host.

It runs until Ctrl-C (SIGINT), then shuts down and exits 0. It prints the
address it listens on to stderr (useful with port 0).`,
		Example: `  pgtransport serve --schema jobs
  pgtransport serve --addr 127.0.0.1:0 --allow-actions`,
		Args: a.exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			if interval <= 0 || window < interval {
				return usageErrorf("--interval %v, --window %v: want an interval above 0 and a window at least as long", interval, window)
			}
			if _, port, err := net.SplitHostPort(addr); err != nil {
				return usageErrorf("--addr %q: %v", addr, err)
			} else if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
				return usageErrorf("--addr %q: the port must be a number from 0 to 65535", addr)
			}
			ctx := cmd.Context()
			tr, err := a.transport(ctx)
			if err != nil {
				return err
			}
			dash, err := dashboard.New(dashboard.Config{
				Transport: tr, DB: a.pool, Schema: a.schema, AllowActions: actions,
				Interval: interval, Window: window, Hosts: hosts,
				Logger: slog.New(slog.NewTextHandler(a.env.stderr, nil)),
			})
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("--addr: %w", err) // exit 1: a port in use is not bad input
			}
			srv := &http.Server{
				Handler:           dash,
				ReadHeaderTimeout: 5 * time.Second,
				ReadTimeout:       10 * time.Second,
				WriteTimeout:      30 * time.Second, // a request's database work is bounded at 15 s
				IdleTimeout:       60 * time.Second,
				MaxHeaderBytes:    64 << 10,
				BaseContext:       func(net.Listener) context.Context { return ctx },
			}
			mode := "read-only: actions are off (--allow-actions allows pause, resume, purge, redrive and dead purge)"
			if actions {
				mode = "actions ON: pause, resume, purge, redrive and dead purge are allowed, each after a confirmation"
			}
			fmt.Fprintf(a.env.stderr, "serving the dashboard on http://%s/; %s\n", ln.Addr(), mode)
			if ip, ok := ln.Addr().(*net.TCPAddr); ok && !ip.IP.IsLoopback() {
				fmt.Fprintf(a.env.stderr, "warning: %s is reachable from other machines, without authentication\n", ln.Addr())
			}

			// Both goroutines are waited for before RunE returns.
			sctx, stopSampling := context.WithCancel(ctx)
			sampled := make(chan error, 1)
			go func() { sampled <- dash.Run(sctx) }()
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			var serveErr error
			select {
			case serveErr = <-served:
			case <-ctx.Done():
			}
			stopSampling()
			shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			shutErr := srv.Shutdown(shut)
			if serveErr == nil {
				serveErr = <-served
			}
			<-sampled
			if !errors.Is(serveErr, http.ErrServerClosed) {
				return fmt.Errorf("serve: %w", serveErr)
			}
			if shutErr != nil {
				return fmt.Errorf("shutdown: %w", shutErr)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8080", "the address to listen on")
	cmd.Flags().BoolVar(&actions, "allow-actions", false, "allow pause, resume, purge, redrive and dead purge from the page")
	cmd.Flags().DurationVar(&interval, "interval", dashboard.DefaultInterval, "how often the server samples the queue (one Stats call)")
	cmd.Flags().DurationVar(&window, "window", dashboard.DefaultWindow, "the span of the overview's chart")
	cmd.Flags().StringSliceVar(&hosts, "host", nil, "a host name requests may use besides IP addresses and localhost (repeatable)")
	return cmd
}
