package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgtransport/pgtransport/metrics"
)

func (a *app) metricsCmd() *cobra.Command {
	var (
		addr, queue string
		interval    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "metrics",
		Short: "Serve the queue's gauges as Prometheus text on /metrics",
		Long: `metrics serves /metrics in the Prometheus text format, from the OpenTelemetry
Prometheus exporter: the queue's gauges (depth, groups by state, oldest head
age, dead letters, waiting consumers; per priority) read by Stats, at most
once per --min-interval however often it is scraped. The series are named
as the metrics module names them (see its package doc), with
messaging.destination.name set to --queue.

It runs until Ctrl-C (SIGINT), then shuts down and exits 0. It prints the
address it listens on to stderr (useful with port 0).

The workers' own counters and histograms (published, acked, durations)
come from the metrics module's Observer inside the workers, not from here.`,
		Example: `  pgtransport metrics --addr 127.0.0.1:9464 --schema jobs
  curl -s 127.0.0.1:9464/metrics | grep pgtransport_queue`,
		Args: a.exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			if interval <= 0 {
				return usageErrorf("--min-interval %v: want more than 0", interval)
			}
			ctx := cmd.Context()
			tr, err := a.transport(ctx)
			if err != nil {
				return err
			}
			reg := prometheus.NewRegistry()
			exp, err := otelprom.New(otelprom.WithRegisterer(reg))
			if err != nil {
				return fmt.Errorf("prometheus exporter: %w", err)
			}
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
			defer func() { _ = mp.Shutdown(context.WithoutCancel(ctx)) }()
			obs, err := metrics.New(metrics.Config{
				MeterProvider: mp,
				Queue:         cmp.Or(queue, a.schema, metrics.DefaultQueue),
				ErrorHandler: func(err error) {
					fmt.Fprintf(a.env.stderr, "pgtransport: stats: %v\n", err)
				},
			})
			if err != nil {
				return err
			}
			unregister, err := obs.ObserveStats(tr.Stats, metrics.StatsOptions{MinInterval: interval})
			if err != nil {
				return err
			}
			defer func() { _ = unregister() }()

			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return usageErrorf("--addr: %v", err)
			}
			mux := http.NewServeMux()
			mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
			srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			fmt.Fprintf(a.env.stderr, "serving metrics on http://%s/metrics\n", ln.Addr())
			select {
			case err := <-served:
				return fmt.Errorf("serve: %w", err)
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil {
				return fmt.Errorf("shutdown: %w", err)
			}
			if err := <-served; !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:9464", "the address to listen on")
	cmd.Flags().StringVar(&queue, "queue", "", "the queue's name on the series (default: --schema, else \"default\")")
	cmd.Flags().DurationVar(&interval, "min-interval", metrics.DefaultMinInterval, "the least time between two reads of Stats")
	return cmd
}
