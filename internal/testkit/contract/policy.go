package contract

import (
	"errors"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// policyCases: the queue's policy, as a Config sets it.
var policyCases = []testCase{
	{"PolicyConfigIsValidatedAndStored", policyConfigIsValidatedAndStored},
}

type policy struct {
	MaxAttempts            int
	OnExhausted            string
	BackoffMin, BackoffMax float64
}

// policy is the queue's policy, which every partition holds alike (the
// case fails if one differs).
func (e *env) policy() policy {
	e.t.Helper()
	var first policy
	for i, pool := range e.pools {
		var p policy
		if err := pool.QueryRow(e.ctx(), `SELECT max_attempts, on_exhausted, backoff_min, backoff_max FROM transport_policy`).Scan(&p.MaxAttempts, &p.OnExhausted, &p.BackoffMin, &p.BackoffMax); err != nil {
			e.t.Fatalf("partition %d: transport_policy: %v", i, err)
		}
		if i == 0 {
			first = p
		} else if p != first {
			e.t.Fatalf("partition %d's policy %+v, partition 0's %+v", i, p, first)
		}
	}
	return first
}

// policyConfigIsValidatedAndStored: a new queue's policy is the
// documented default; a Config.Policy or SetPolicy out of range is
// refused and writes nothing; a valid one is written whole (a zero field
// is its default), on open or by SetPolicy; a Config without a Policy
// leaves the stored one alone; Policy reads it back.
func policyConfigIsValidatedAndStored(is *is.I, e *env) {
	is.Equal(e.policy(), policy{pgtransport.DefaultMaxAttempts, "dead_letter", 1, 60}) // a new queue's
	bad := map[string]pgtransport.Policy{
		"MaxAttemptsMinus2":        {MaxAttempts: -2},
		"NegativeBackoffMin":       {RetryBackoffMin: -time.Second},
		"NegativeBackoffMax":       {RetryBackoffMax: -time.Second},
		"MinAboveMax":              {RetryBackoffMin: 10 * time.Second, RetryBackoffMax: 5 * time.Second},
		"MinAboveTheDefaultMax":    {RetryBackoffMin: 2 * time.Minute},
		"BackoffBelowMillisecond":  {RetryBackoffMin: time.Microsecond},
		"BackoffAbove24h":          {RetryBackoffMax: 25 * time.Hour},
		"UnknownOnExhausted":       {OnExhausted: "explode"},
		"NegativeStateRetention":   {StateRetention: -time.Second},
		"BadBesideGoodMaxAttempts": {MaxAttempts: 3, RetryBackoffMin: -time.Second},
	}
	for name, p := range bad {
		if _, err := e.openCfg(pgtransport.Config{Policy: &p}); !errors.Is(err, pgtransport.ErrInvalidConfig) {
			e.t.Errorf("%s: open got %v, want ErrInvalidConfig", name, err)
		}
		if err := e.tr.SetPolicy(e.ctx(), p); !errors.Is(err, pgtransport.ErrInvalidConfig) {
			e.t.Errorf("%s: SetPolicy got %v, want ErrInvalidConfig", name, err)
		}
	}
	for name, cfg := range map[string]pgtransport.Config{"NegativeDedupWindow": {DedupWindow: -time.Second}, "DedupWindowAbove24h": {DedupWindow: 25 * time.Hour}} {
		if _, err := e.openCfg(cfg); !errors.Is(err, pgtransport.ErrInvalidConfig) {
			e.t.Errorf("%s: got %v, want ErrInvalidConfig", name, err)
		}
	}
	is.Equal(e.policy(), policy{pgtransport.DefaultMaxAttempts, "dead_letter", 1, 60}) // nothing written

	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: pgtransport.Unlimited}})
	is.Equal(e.policy(), policy{0, "dead_letter", 1, 60}) // 0: never dead-letter
	e.with(pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 3, OnExhausted: pgtransport.StopGroup, RetryBackoffMin: 2 * time.Second, RetryBackoffMax: 30 * time.Second}})
	is.Equal(e.policy(), policy{3, "stop", 2, 30})
	e.with(pgtransport.Config{})
	is.Equal(e.policy(), policy{3, "stop", 2, 30}) // no Policy: the stored one is left alone
	is.NoErr(e.tr.SetPolicy(e.ctx(), pgtransport.Policy{RetryBackoffMin: 5 * time.Millisecond}))
	is.Equal(e.policy(), policy{pgtransport.DefaultMaxAttempts, "dead_letter", 0.005, 60}) // whole: the zero fields are defaults again
	got, err := e.tr.Policy(e.ctx())
	is.NoErr(err)
	is.Equal(got, pgtransport.Policy{MaxAttempts: pgtransport.DefaultMaxAttempts, OnExhausted: pgtransport.DeadLetterHead, RetryBackoffMin: 5 * time.Millisecond, RetryBackoffMax: time.Minute}) // read back
}
