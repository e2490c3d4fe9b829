package core

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// TestDefaultsChecksPolicy: each policy or dedup field out of range is
// ErrInvalidConfig; the edges of each range pass, DedupWindow 0 takes its
// default, and a Policy is passed on as given (its zero fields mean the
// defaults when it is written: TestSetPolicy).
func TestDefaultsChecksPolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  pgtransport.Config
		ok   bool
	}{
		{"zero", pgtransport.Config{}, true},
		{"MaxAttempts Unlimited", pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: pgtransport.Unlimited}}, true},
		{"MaxAttempts 1", pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 1}}, true},
		{"MaxAttempts -2", pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: -2}}, false},
		{"MaxAttempts above int32", pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 1 << 31}}, false},
		{"backoff bounds at the edges", pgtransport.Config{Policy: &pgtransport.Policy{RetryBackoffMin: time.Millisecond, RetryBackoffMax: 24 * time.Hour}}, true},
		{"min equal to max", pgtransport.Config{Policy: &pgtransport.Policy{RetryBackoffMin: time.Second, RetryBackoffMax: time.Second}}, true},
		{"negative min", pgtransport.Config{Policy: &pgtransport.Policy{RetryBackoffMin: -time.Second}}, false},
		{"negative max", pgtransport.Config{Policy: &pgtransport.Policy{RetryBackoffMax: -time.Second}}, false},
		{"min below 1 ms", pgtransport.Config{Policy: &pgtransport.Policy{RetryBackoffMin: time.Millisecond - 1}}, false},
		{"max above 24 h", pgtransport.Config{Policy: &pgtransport.Policy{RetryBackoffMax: 24*time.Hour + 1}}, false},
		{"min above max", pgtransport.Config{Policy: &pgtransport.Policy{RetryBackoffMin: 2 * time.Second, RetryBackoffMax: time.Second}}, false},
		{"min above the default max", pgtransport.Config{Policy: &pgtransport.Policy{RetryBackoffMin: 2 * time.Minute}}, false},
		{"StateRetention negative", pgtransport.Config{Policy: &pgtransport.Policy{StateRetention: -1}}, false},
		{"StateRetention above its bound", pgtransport.Config{Policy: &pgtransport.Policy{StateRetention: pgtransport.MaxStateRetention + 1}}, false},
		{"OnExhausted dead letter", pgtransport.Config{Policy: &pgtransport.Policy{OnExhausted: pgtransport.DeadLetterHead}}, true},
		{"OnExhausted stop", pgtransport.Config{Policy: &pgtransport.Policy{OnExhausted: pgtransport.StopGroup}}, true},
		{"OnExhausted unknown", pgtransport.Config{Policy: &pgtransport.Policy{OnExhausted: "skip"}}, false},
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
			is.Equal(got.Policy, tc.cfg.Policy) // passed on as given
			if tc.cfg.DedupWindow == 0 {
				is.Equal(got.DedupWindow, pgtransport.DefaultDedupWindow) // the default filled in
			}
			again, err := Defaults(got)
			is.NoErr(err)
			is.Equal(again.DedupWindow, got.DedupWindow) // idempotent
		})
	}
}

// TestPolicyRow: a Policy's zero fields are its defaults, Unlimited
// stores 0, and a stored row reads back as the Policy that wrote it.
func TestPolicyRow(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	is.Equal(row(pgtransport.Policy{}), policy{pgtransport.DefaultMaxAttempts, "dead_letter", 1, 60, 0}) // the defaults
	is.Equal(row(pgtransport.Policy{MaxAttempts: pgtransport.Unlimited}).maxAttempts, int32(0))          // never exhausted
	is.Equal(row(pgtransport.Policy{MaxAttempts: 3, OnExhausted: pgtransport.StopGroup}), policy{3, "stop", 1, 60, 0})
	is.Equal(row(pgtransport.Policy{RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 2 * time.Second}), policy{10, "dead_letter", 0.01, 2, 0})
	is.Equal(row(pgtransport.Policy{StateRetention: time.Minute}).stateRetention, 60.0)
	for _, p := range []pgtransport.Policy{
		{MaxAttempts: pgtransport.Unlimited, OnExhausted: pgtransport.StopGroup, RetryBackoffMin: time.Second, RetryBackoffMax: time.Hour, StateRetention: time.Minute},
		{MaxAttempts: 7, OnExhausted: pgtransport.DeadLetterHead, RetryBackoffMin: 5 * time.Millisecond, RetryBackoffMax: time.Second},
	} {
		is.Equal(row(p).asPolicy(), p) // read back as written
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

// TestSetPolicy: a Config.Policy is applied whole on open, SkipApply or
// not (a zero field is its default, not "leave it"); a Config without
// one writes nothing, so a worker whose role may not write the policy
// opens after an owner changed it; SetPolicy replaces it whole; a bad
// Policy is ErrInvalidConfig and writes nothing.
func TestSetPolicy(t *testing.T) {
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
	open := func(cfg pgtransport.Config) (*Core, error) {
		cfg.Schema = db.Schema
		return New(ctx, db.Pool, cfg)
	}
	c, err := open(pgtransport.Config{})
	is.NoErr(err)
	is.Equal(stored(), policy{pgtransport.DefaultMaxAttempts, "dead_letter", 1, 60, 0}) // a new queue's defaults
	_, err = open(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 3, OnExhausted: pgtransport.StopGroup}})
	is.NoErr(err)
	is.Equal(stored(), policy{3, "stop", 1, 60, 0})
	_, err = open(pgtransport.Config{SkipApply: true, Policy: &pgtransport.Policy{RetryBackoffMin: 10 * time.Millisecond}})
	is.NoErr(err)
	is.Equal(stored(), policy{10, "dead_letter", 0.01, 60, 0}) // whole, with SkipApply too: the unset fields are defaults again
	_, err = open(pgtransport.Config{})
	is.NoErr(err)
	is.Equal(stored(), policy{10, "dead_letter", 0.01, 60, 0}) // no Policy: left alone
	_, err = open(pgtransport.Config{Policy: &pgtransport.Policy{RetryBackoffMin: 2 * time.Minute}})
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig))      // above the default max
	is.Equal(stored(), policy{10, "dead_letter", 0.01, 60, 0}) // nothing written
	is.NoErr(c.SetPolicy(ctx, pgtransport.Policy{MaxAttempts: pgtransport.Unlimited, StateRetention: 90 * time.Second}))
	is.Equal(stored(), policy{0, "dead_letter", 1, 60, 90}) // never exhausted; a drained group's state kept 90 s
	got, err := c.Policy(ctx)
	is.NoErr(err)
	is.Equal(got, pgtransport.Policy{MaxAttempts: pgtransport.Unlimited, OnExhausted: pgtransport.DeadLetterHead, RetryBackoffMin: time.Second, RetryBackoffMax: time.Minute, StateRetention: 90 * time.Second})
	err = c.SetPolicy(ctx, pgtransport.Policy{StateRetention: pgtransport.MaxStateRetention + time.Second})
	is.True(errors.Is(err, pgtransport.ErrInvalidConfig))   // over the bound
	is.Equal(stored(), policy{0, "dead_letter", 1, 60, 90}) // nothing written
}

// TestVerdict: a Fail's cause asks for a snooze or an immediate dead
// letter by the outermost of the two wrappers in its chain; a plain error
// asks for neither.
func TestVerdict(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	s, b := verdict(errors.New("plain"))
	is.True(s == nil && b == nil)
	s, b = verdict(pgtransport.DeadLetterNow(pgtransport.Snooze(time.Second)))
	is.True(s == nil && b != nil) // the outer dead letter wins
	s, b = verdict(fmt.Errorf("wrapped: %w", pgtransport.Snooze(time.Second)))
	is.True(s != nil && b == nil && s.Delay == time.Second) // found through a wrap
	s, b = verdict(errors.Join(errors.New("x"), pgtransport.DeadLetterNow(nil)))
	is.True(s == nil && b != nil) // and in a joined error
}
