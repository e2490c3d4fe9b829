// Package outage logs a run of failures of something that retries on its
// own (a stream's round-trips, a listener's connection) as an operator
// wants to read it: the first failure at Warn, the retries that fail too
// at Debug (an outage of minutes must not flood the log), and the
// recovery at Info, with how long it lasted and how many tries failed.
package outage

import (
	"context"
	"log/slog"
	"time"
)

// Log tracks one run of failures. Its zero value is ready: no outage. It
// is not safe for concurrent use: the goroutine that retries owns it.
type Log struct {
	since    time.Time // the first failure of the run; zero while none
	failures int
}

// Failed records a failure, err, and logs it: at Warn if it begins an
// outage, else at Debug. msg says what failed and that it is retried.
func (o *Log) Failed(lg *slog.Logger, msg string, err error, attrs ...slog.Attr) {
	level := slog.LevelDebug
	if o.failures == 0 {
		o.since, level = time.Now(), slog.LevelWarn
	}
	o.failures++
	if !lg.Enabled(context.Background(), level) {
		return
	}
	attrs = append(attrs, slog.Any("error", err), slog.Int("failures", o.failures))
	lg.LogAttrs(context.Background(), level, msg, attrs...)
}

// Recovered ends an outage, if one is under way, logging it at Info
// with its length and failure count; else it does nothing. A call on the
// happy path is a comparison.
func (o *Log) Recovered(lg *slog.Logger, msg string, attrs ...slog.Attr) {
	if o.failures == 0 {
		return
	}
	attrs = append(attrs, slog.Duration("outage", time.Since(o.since)), slog.Int("failures", o.failures))
	lg.LogAttrs(context.Background(), slog.LevelInfo, msg, attrs...)
	*o = Log{}
}

// Down reports whether an outage is under way.
func (o *Log) Down() bool { return o.failures > 0 }
