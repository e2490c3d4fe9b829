package async_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/contract"
)

// TestClosedEveryMethod: every method delivers ErrClosed after Close, whether the
// Transport owns its pool (FromDSN) or not (New).
func TestClosedEveryMethod(t *testing.T) {
	contract.RunClosed(t,
		func(t *testing.T, pool *pgxpool.Pool, cfg pgtransport.Config) contract.Transport {
			return blocking{open(t, pool, cfg)}
		},
		func(t *testing.T, dsn string, cfg pgtransport.Config) contract.Transport {
			tr, err := async.FromDSN(ctx(t), dsn, cfg)
			if err != nil {
				t.Fatalf("FromDSN: %v", err)
			}
			t.Cleanup(tr.Close)
			return blocking{tr}
		})
}

// TestStreamVisibilityFloor: a stream's visibility below
// MinVisibility is refused, as a claim's is; MinVisibility is accepted.
func TestStreamVisibilityFloor(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, _, _ := setup(t, pgtransport.Config{})
	for _, vis := range []time.Duration{time.Nanosecond, pgtransport.MinVisibility - time.Nanosecond} {
		_, err := tr.Stream(ctx(t), async.StreamConfig{WorkerID: "w", Visibility: vis})
		is.True(errors.Is(err, pgtransport.ErrInvalidVisibility)) // refused
	}
	s, err := tr.Stream(ctx(t), async.StreamConfig{WorkerID: "w", Visibility: pgtransport.MinVisibility})
	is.NoErr(err) // the floor itself is fine
	s.Close()
}
