package core

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// TestDefaultsChecksPolicy: each policy or dedup field out of range is
// ErrInvalidConfig; the edges of each range pass, and DedupWindow 0 takes
// its default while the policy fields stay 0 (the queue's setting).
func TestDefaultsChecksPolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  pgtransport.Config
		ok   bool
	}{
		{"zero", pgtransport.Config{}, true},
		{"MaxAttempts Unlimited", pgtransport.Config{MaxAttempts: pgtransport.Unlimited}, true},
		{"MaxAttempts 1", pgtransport.Config{MaxAttempts: 1}, true},
		{"MaxAttempts -2", pgtransport.Config{MaxAttempts: -2}, false},
		{"MaxAttempts above int32", pgtransport.Config{MaxAttempts: 1 << 31}, false},
		{"backoff bounds at the edges", pgtransport.Config{RetryBackoffMin: time.Millisecond, RetryBackoffMax: 24 * time.Hour}, true},
		{"min equal to max", pgtransport.Config{RetryBackoffMin: time.Second, RetryBackoffMax: time.Second}, true},
		{"negative min", pgtransport.Config{RetryBackoffMin: -time.Second}, false},
		{"negative max", pgtransport.Config{RetryBackoffMax: -time.Second}, false},
		{"min below 1 ms", pgtransport.Config{RetryBackoffMin: time.Millisecond - 1}, false},
		{"max above 24 h", pgtransport.Config{RetryBackoffMax: 24*time.Hour + 1}, false},
		{"min above max", pgtransport.Config{RetryBackoffMin: 2 * time.Second, RetryBackoffMax: time.Second}, false},
		{"OnExhausted dead letter", pgtransport.Config{OnExhausted: pgtransport.DeadLetterHead}, true},
		{"OnExhausted stop", pgtransport.Config{OnExhausted: pgtransport.StopGroup}, true},
		{"OnExhausted unknown", pgtransport.Config{OnExhausted: "skip"}, false},
		{"DedupWindow 24 h", pgtransport.Config{DedupWindow: 24 * time.Hour}, true},
		{"DedupWindow negative", pgtransport.Config{DedupWindow: -1}, false},
		{"DedupWindow above 24 h", pgtransport.Config{DedupWindow: 24*time.Hour + 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			got, err := Defaults(tc.cfg)
			if !tc.ok {
				is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // refused
				return
			}
			is.NoErr(err)
			is.Equal(got.MaxAttempts, tc.cfg.MaxAttempts)         // left for the queue's setting
			is.Equal(got.RetryBackoffMin, tc.cfg.RetryBackoffMin) // left
			is.Equal(got.OnExhausted, tc.cfg.OnExhausted)         // left
			if tc.cfg.DedupWindow == 0 {
				is.Equal(got.DedupWindow, pgtransport.DefaultDedupWindow) // the default filled in
			}
			again, err := Defaults(got)
			is.NoErr(err)
			is.Equal(again.DedupWindow, got.DedupWindow) // idempotent
		})
	}
}

// TestPolicyWith: a Config overrides only the fields it sets, Unlimited
// stores 0, and a Config that sets none is not a policy write.
func TestPolicyWith(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	stored := policy{maxAttempts: 10, onExhausted: "dead_letter", backoffMin: 1, backoffMax: 60}
	is.Equal(stored.with(pgtransport.Config{}), stored) // nothing set
	is.True(!setsPolicy(pgtransport.Config{DedupWindow: time.Minute, MaxKeep: 3}))
	is.Equal(stored.with(pgtransport.Config{MaxAttempts: pgtransport.Unlimited}).maxAttempts, int32(0)) // never exhausted
	is.Equal(stored.with(pgtransport.Config{MaxAttempts: 3}), policy{3, "dead_letter", 1, 60, 0})
	is.Equal(stored.with(pgtransport.Config{OnExhausted: pgtransport.StopGroup}), policy{10, "stop", 1, 60, 0})
	is.Equal(stored.with(pgtransport.Config{RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 2 * time.Second}), policy{10, "dead_letter", 0.01, 2, 0})
	is.Equal(stored.with(pgtransport.Config{StateRetention: -time.Second}).stateRetention, 0.0) // negative: none
	is.Equal(stored.with(pgtransport.Config{StateRetention: time.Minute}).stateRetention, 60.0)
	for _, cfg := range []pgtransport.Config{
		{MaxAttempts: -1}, {MaxAttempts: 1}, {RetryBackoffMin: time.Second}, {RetryBackoffMax: time.Second}, {OnExhausted: pgtransport.StopGroup},
		{StateRetention: time.Second}, {StateRetention: -1},
	} {
		is.True(setsPolicy(cfg)) // each policy field is one
	}
}

// TestCauseText: a cause's text is kept as is when it fits, and otherwise
// always becomes valid UTF-8 without NUL, at most MaxErrorBytes, cut at a
// rune boundary.
func TestCauseText(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", pgtransport.MaxErrorBytes) // 2 bytes a rune
	for _, tc := range []struct {
		name  string
		cause error
		want  string
	}{
		{"nil", nil, ""},
		{"plain", errors.New("boom"), "boom"},
		{"NUL dropped", errors.New("a\x00b"), "ab"},
		{"invalid UTF-8 replaced", errors.New("a\xffb"), "a\uFFFDb"},
		{"exactly the limit", errors.New(strings.Repeat("x", pgtransport.MaxErrorBytes)), strings.Repeat("x", pgtransport.MaxErrorBytes)},
		{"cut", errors.New(strings.Repeat("x", pgtransport.MaxErrorBytes+1)), strings.Repeat("x", pgtransport.MaxErrorBytes)},
		{"cut at a rune boundary", errors.New("x" + long), "x" + long[:pgtransport.MaxErrorBytes-2]},
		{"NULs do not count", errors.New(strings.Repeat("\x00", 10) + strings.Repeat("y", pgtransport.MaxErrorBytes)), strings.Repeat("y", pgtransport.MaxErrorBytes)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			got := CauseText(tc.cause)
			is.Equal(got, tc.want)
			is.True(len(got) <= pgtransport.MaxErrorBytes) // bounded
			is.True(utf8.ValidString(got))                 // valid UTF-8
			is.True(!strings.ContainsRune(got, 0))         // no NUL
		})
	}
}

// TestCheckDedupKey: "" is no key; a key up to MaxDedupKeyBytes of valid
// UTF-8 without NUL passes; anything else is ErrInvalidDedupKey.
func TestCheckDedupKey(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	for _, ok := range []string{"", "k", strings.Repeat("k", pgtransport.MaxDedupKeyBytes), "ключ"} {
		is.NoErr(checkDedupKey(ok))
	}
	for _, bad := range []string{strings.Repeat("k", pgtransport.MaxDedupKeyBytes+1), "a\xffb", "a\x00b"} {
		is.True(errors.Is(checkDedupKey(bad), pgtransport.ErrInvalidDedupKey)) // refused
	}
}

// TestWritePolicy: New writes the policy fields its Config sets, SkipApply
// or not, leaves the others, and refuses a bound that would cross the
// stored other one, writing nothing.
func TestWritePolicy(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	db := pgtest.New(t, 2)
	ctx := pgtest.Context(t)
	stored := func() policy {
		var p policy
		is.NoErr(db.Pool.QueryRow(ctx, `SELECT max_attempts, on_exhausted, backoff_min, backoff_max, state_retention FROM transport_policy`).
			Scan(&p.maxAttempts, &p.onExhausted, &p.backoffMin, &p.backoffMax, &p.stateRetention))
		return p
	}
	open := func(cfg pgtransport.Config) error {
		cfg.Schema = db.Schema
		_, err := New(ctx, db.Pool, cfg)
		return err
	}
	is.NoErr(open(pgtransport.Config{}))
	is.Equal(stored(), policy{pgtransport.DefaultMaxAttempts, "dead_letter", 1, 60, 0}) // a new queue's defaults
	is.NoErr(open(pgtransport.Config{MaxAttempts: 3, OnExhausted: pgtransport.StopGroup}))
	is.Equal(stored(), policy{3, "stop", 1, 60, 0})
	is.NoErr(open(pgtransport.Config{SkipApply: true, RetryBackoffMin: 10 * time.Millisecond}))
	is.Equal(stored(), policy{3, "stop", 0.01, 60, 0}) // written with SkipApply too; the rest left
	err := open(pgtransport.Config{RetryBackoffMin: 2 * time.Minute})
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // above the stored max
	is.Equal(stored(), policy{3, "stop", 0.01, 60, 0})    // nothing written
	is.NoErr(open(pgtransport.Config{RetryBackoffMin: 2 * time.Minute, RetryBackoffMax: 5 * time.Minute}))
	is.Equal(stored(), policy{3, "stop", 120, 300, 0}) // both bounds in one UPDATE
	is.NoErr(open(pgtransport.Config{MaxAttempts: pgtransport.Unlimited}))
	is.Equal(stored().maxAttempts, int32(0)) // never exhausted
	is.NoErr(open(pgtransport.Config{StateRetention: 90 * time.Second}))
	is.Equal(stored().stateRetention, 90.0) // a drained group's state kept 90 s
	is.NoErr(open(pgtransport.Config{StateRetention: -1}))
	is.Equal(stored().stateRetention, 0.0) // negative: none
	err = open(pgtransport.Config{StateRetention: pgtransport.MaxStateRetention + time.Second})
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig)) // over the bound
}
