package worker

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// fakeTx is a pgx.Tx that records how it ended; its other methods are not
// used here (the embedded nil interface would panic).
type fakeTx struct {
	pgx.Tx
	committed, rolledBack atomic.Bool
	commitErr             error
}

func (t *fakeTx) Commit(context.Context) error {
	if t.commitErr != nil {
		return t.commitErr
	}
	t.committed.Store(true)
	return nil
}

func (t *fakeTx) Rollback(context.Context) error { t.rolledBack.Store(true); return nil }

// txFake is fake with a transaction per lease, and an ack in it that
// answers ackErr.
type txFake struct {
	*fake
	tx     *fakeTx
	ackErr error
	state  []byte // the state the last ack saved
	done   chan struct{}
}

func (f *txFake) Begin(context.Context) (pgx.Tx, error) { return f.tx, nil }

func (f *txFake) StateTx(context.Context, pgx.Tx, string) ([]byte, error) { return []byte("s0"), nil }

func (f *txFake) AckStateTx(_ context.Context, _ pgx.Tx, _ *pgtransport.Lease, state []byte, _ bool) (*pgtransport.Lease, error) {
	f.state = state
	return nil, f.ackErr
}

func (f *txFake) Settled(*pgtransport.Lease) { close(f.done) }

func (f *txFake) Unclaim(context.Context, *pgtransport.Lease) {}

// TestRunTx: a transactional handler's result decides how its
// transaction ends: nil acks with the new state and commits (Settled); an
// error, or a panic, rolls back and fails the attempt; an ack that finds
// the lease lost rolls back and fails nothing; a commit the database
// refuses fails the attempt.
func TestRunTx(t *testing.T) {
	refused := &pgconn.PgError{Code: "23505"} // a deferred constraint's refusal of the COMMIT
	for _, tc := range []struct {
		name              string
		h                 pgtransport.TxHandler
		ackErr, commitErr error
		committed, failed bool
		wantState         string
	}{
		{"nil commits", func(_ context.Context, _ pgx.Tx, _ *pgtransport.Lease, s []byte) ([]byte, error) {
			return append(s, '+'), nil
		}, nil, nil, true, false, "s0+"},
		{"error rolls back", func(context.Context, pgx.Tx, *pgtransport.Lease, []byte) ([]byte, error) {
			return nil, errors.New("boom")
		}, nil, nil, false, true, ""},
		{"panic rolls back", func(context.Context, pgx.Tx, *pgtransport.Lease, []byte) ([]byte, error) {
			panic("bug")
		}, nil, nil, false, true, ""},
		{"lost lease rolls back", func(_ context.Context, _ pgx.Tx, _ *pgtransport.Lease, s []byte) ([]byte, error) {
			return s, nil
		}, pgtransport.ErrLeaseLost, nil, false, false, "s0"},
		{"refused commit fails", func(_ context.Context, _ pgx.Tx, _ *pgtransport.Lease, s []byte) ([]byte, error) {
			return s, nil
		}, nil, refused, false, true, "s0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			f := &txFake{fake: newFake(), tx: &fakeTx{commitErr: tc.commitErr}, ackErr: tc.ackErr, done: make(chan struct{})}
			f.next <- lease("g", time.Minute)
			ctx, cancel := context.WithCancel(context.Background())
			cfg := config(t, &logs{}, pgtransport.WorkerConfig{Concurrency: 1})
			res := make(chan error, 1)
			go func() { res <- RunTx(ctx, cfg, f, tc.h) }()
			deadline := time.Now().Add(5 * time.Second)
			for {
				_, failed, _, _ := f.counts()
				if f.tx.committed.Load() || failed > 0 || f.tx.rolledBack.Load() && !tc.failed || time.Now().After(deadline) {
					break
				}
				time.Sleep(time.Millisecond) // kept: polls the fake, which has no channel for a rollback
			}
			cancel()
			is.NoErr(within(t, res, 5*time.Second, "RunTx"))
			_, failed, _, _ := f.counts()
			is.Equal(f.tx.committed.Load(), tc.committed)                          // committed
			is.Equal(f.tx.rolledBack.Load(), !tc.committed && tc.commitErr == nil) // else rolled back (a failed COMMIT ends it itself)
			is.Equal(failed > 0, tc.failed)                                        // the attempt failed
			is.Equal(string(f.state), tc.wantState)                                // the state the ack saved
			if tc.committed {
				within(t, f.done, time.Second, "Settled")
			}
		})
	}
}
