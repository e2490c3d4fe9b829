package async_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/internal/testkit/contract"
)

// TestContract runs the contract against the async transport, through
// blocking, on one database and over four partitions.
func TestContract(t *testing.T) {
	contract.Run(t, contract.Opener{DB: openDB, Partitions: openPartitions})
}

// openDB opens the transport under test on one database.
func openDB(t *testing.T, db core.DBTX, cfg pgtransport.Config) (contract.Transport, error) {
	tr, err := async.New(context.Background(), db.(*pgxpool.Pool), cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(tr.Close)
	return blocking{tr}, nil
}

// openPartitions opens the transport under test over partitions.
func openPartitions(t *testing.T, pools []*pgxpool.Pool, cfg pgtransport.Config) (contract.Transport, error) {
	c, err := async.NewCluster(context.Background(), pools, cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(c.Close)
	return blocking{c}, nil
}

// TestOpenCluster opens the transport over partitions from its proxy's
// map.
func TestOpenCluster(t *testing.T) {
	contract.RunOpenCluster(t, func(ctx context.Context, proxyDSN string, cfg pgtransport.Config) (contract.Transport, error) {
		c, err := async.OpenCluster(ctx, proxyDSN, cfg)
		if err != nil {
			return nil, err
		}
		return blocking{c}, nil
	})
}

// blocking adapts the async Transport (on one database or over
// partitions) to the blocking contract by waiting on each call's channel.
type blocking struct{ t asyncAPI }

// asyncAPI is the part of the channel-based API the contract calls.
type asyncAPI interface {
	Publish(ctx context.Context, group, event string, priority int) <-chan async.Result[int64]
	Claim(ctx context.Context, workerID string, visibility time.Duration, minPriority int) <-chan async.Result[*pgtransport.Lease]
	Ack(ctx context.Context, lease *pgtransport.Lease) <-chan error
	Nack(ctx context.Context, lease *pgtransport.Lease, delay time.Duration) <-chan error
	Extend(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) <-chan error
	PublishMany(ctx context.Context, msgs []pgtransport.Message) <-chan async.Result[[]int64]
	ClaimMany(ctx context.Context, workerID string, visibility time.Duration, minPriority, max int) <-chan async.Result[[]*pgtransport.Lease]
	AckMany(ctx context.Context, leases []*pgtransport.Lease) <-chan async.Result[[]error]
	AckNext(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) <-chan async.Result[*pgtransport.Lease]
	ClaimWait(ctx context.Context, workerID string, visibility time.Duration, minPriority int) <-chan async.Result[*pgtransport.Lease]
	Fail(ctx context.Context, lease *pgtransport.Lease, cause error) <-chan error
	PublishMessage(ctx context.Context, msg pgtransport.Message) <-chan async.Result[int64]
	PublishMessageTx(ctx context.Context, tx pgx.Tx, msg pgtransport.Message) <-chan async.Result[int64]
	DeadLetters(ctx context.Context, q pgtransport.DeadLetterQuery) <-chan async.Result[[]pgtransport.DeadLetter]
	Redrive(ctx context.Context, f pgtransport.DeadLetterFilter) <-chan async.Result[int64]
	PurgeDeadLetters(ctx context.Context, f pgtransport.DeadLetterFilter) <-chan async.Result[int64]
	RestartGroup(ctx context.Context, group string, skipHead bool) <-chan error
	SetPolicy(ctx context.Context, p pgtransport.Policy) <-chan error
	Policy(ctx context.Context) <-chan async.Result[pgtransport.Policy]
	AckTx(ctx context.Context, tx pgx.Tx, lease *pgtransport.Lease) <-chan error
	AckStateTx(ctx context.Context, tx pgx.Tx, lease *pgtransport.Lease, state []byte) <-chan error
	State(ctx context.Context, group string) <-chan async.Result[[]byte]
	StateTx(ctx context.Context, tx pgx.Tx, group string) <-chan async.Result[[]byte]
	Stats(ctx context.Context) <-chan async.Result[pgtransport.Stats]
	Groups(ctx context.Context, q pgtransport.GroupQuery) <-chan async.Result[[]pgtransport.GroupInfo]
	Group(ctx context.Context, group string) <-chan async.Result[pgtransport.GroupInfo]
	Peek(ctx context.Context, group string, n int) <-chan async.Result[[]pgtransport.PeekedMessage]
	PauseGroup(ctx context.Context, group string) <-chan error
	ResumeGroup(ctx context.Context, group string) <-chan error
	PurgeGroup(ctx context.Context, group string, limit int) <-chan async.Result[int64]
	SetTenantWeight(ctx context.Context, tenant string, weight int) <-chan error
	Tenants(ctx context.Context) <-chan async.Result[[]pgtransport.TenantInfo]
	Work(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.Handler) error
	WorkTx(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.TxHandler) error
	PublishTx(ctx context.Context, tx pgx.Tx, group, event string, priority int) <-chan async.Result[int64]
	Close()
}

func (b blocking) Publish(ctx context.Context, group, event string, priority int) (int64, error) {
	r := <-b.t.Publish(ctx, group, event, priority)
	return r.Value, r.Err
}

func (b blocking) Claim(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	r := <-b.t.Claim(ctx, workerID, visibility, minPriority)
	return r.Value, r.Err
}

func (b blocking) Ack(ctx context.Context, l *pgtransport.Lease) error { return <-b.t.Ack(ctx, l) }

func (b blocking) Nack(ctx context.Context, l *pgtransport.Lease, delay time.Duration) error {
	return <-b.t.Nack(ctx, l, delay)
}

func (b blocking) Extend(ctx context.Context, l *pgtransport.Lease, visibility time.Duration) error {
	return <-b.t.Extend(ctx, l, visibility)
}

func (b blocking) PublishMany(ctx context.Context, msgs []pgtransport.Message) ([]int64, error) {
	r := <-b.t.PublishMany(ctx, msgs)
	return r.Value, r.Err
}

func (b blocking) ClaimMany(ctx context.Context, workerID string, visibility time.Duration, minPriority, max int) ([]*pgtransport.Lease, error) {
	r := <-b.t.ClaimMany(ctx, workerID, visibility, minPriority, max)
	return r.Value, r.Err
}

func (b blocking) AckMany(ctx context.Context, leases []*pgtransport.Lease) ([]error, error) {
	r := <-b.t.AckMany(ctx, leases)
	return r.Value, r.Err
}

func (b blocking) AckNext(ctx context.Context, l *pgtransport.Lease, visibility time.Duration) (*pgtransport.Lease, error) {
	r := <-b.t.AckNext(ctx, l, visibility)
	return r.Value, r.Err
}

func (b blocking) ClaimWait(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	r := <-b.t.ClaimWait(ctx, workerID, visibility, minPriority)
	return r.Value, r.Err
}

func (b blocking) Fail(ctx context.Context, l *pgtransport.Lease, cause error) error {
	return <-b.t.Fail(ctx, l, cause)
}

func (b blocking) PublishMessage(ctx context.Context, msg pgtransport.Message) (int64, error) {
	r := <-b.t.PublishMessage(ctx, msg)
	return r.Value, r.Err
}

func (b blocking) PublishMessageTx(ctx context.Context, tx pgx.Tx, msg pgtransport.Message) (int64, error) {
	r := <-b.t.PublishMessageTx(ctx, tx, msg)
	return r.Value, r.Err
}

func (b blocking) DeadLetters(ctx context.Context, q pgtransport.DeadLetterQuery) ([]pgtransport.DeadLetter, error) {
	r := <-b.t.DeadLetters(ctx, q)
	return r.Value, r.Err
}

func (b blocking) Redrive(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error) {
	r := <-b.t.Redrive(ctx, f)
	return r.Value, r.Err
}

func (b blocking) PurgeDeadLetters(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error) {
	r := <-b.t.PurgeDeadLetters(ctx, f)
	return r.Value, r.Err
}

func (b blocking) RestartGroup(ctx context.Context, group string, skipHead bool) error {
	return <-b.t.RestartGroup(ctx, group, skipHead)
}

func (b blocking) SetPolicy(ctx context.Context, p pgtransport.Policy) error {
	return <-b.t.SetPolicy(ctx, p)
}

func (b blocking) Policy(ctx context.Context) (pgtransport.Policy, error) {
	r := <-b.t.Policy(ctx)
	return r.Value, r.Err
}

func (b blocking) PublishTx(ctx context.Context, tx pgx.Tx, group, event string, priority int) (int64, error) {
	r := <-b.t.PublishTx(ctx, tx, group, event, priority)
	return r.Value, r.Err
}

func (b blocking) Close() { b.t.Close() }

// The exactly-once calls (contract.Exactly).

func (b blocking) AckTx(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease) error {
	return <-b.t.AckTx(ctx, tx, l)
}

func (b blocking) AckStateTx(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease, state []byte) error {
	return <-b.t.AckStateTx(ctx, tx, l, state)
}

func (b blocking) State(ctx context.Context, group string) ([]byte, error) {
	r := <-b.t.State(ctx, group)
	return r.Value, r.Err
}

func (b blocking) StateTx(ctx context.Context, tx pgx.Tx, group string) ([]byte, error) {
	r := <-b.t.StateTx(ctx, tx, group)
	return r.Value, r.Err
}

func (b blocking) WorkTx(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.TxHandler) error {
	return b.t.WorkTx(ctx, cfg, h)
}

// The operator's calls (contract.Operator).

func (b blocking) Stats(ctx context.Context) (pgtransport.Stats, error) {
	r := <-b.t.Stats(ctx)
	return r.Value, r.Err
}

func (b blocking) Groups(ctx context.Context, q pgtransport.GroupQuery) ([]pgtransport.GroupInfo, error) {
	r := <-b.t.Groups(ctx, q)
	return r.Value, r.Err
}

func (b blocking) Group(ctx context.Context, group string) (pgtransport.GroupInfo, error) {
	r := <-b.t.Group(ctx, group)
	return r.Value, r.Err
}

func (b blocking) Peek(ctx context.Context, group string, n int) ([]pgtransport.PeekedMessage, error) {
	r := <-b.t.Peek(ctx, group, n)
	return r.Value, r.Err
}

func (b blocking) PauseGroup(ctx context.Context, group string) error {
	return <-b.t.PauseGroup(ctx, group)
}

func (b blocking) ResumeGroup(ctx context.Context, group string) error {
	return <-b.t.ResumeGroup(ctx, group)
}

func (b blocking) PurgeGroup(ctx context.Context, group string, limit int) (int64, error) {
	r := <-b.t.PurgeGroup(ctx, group, limit)
	return r.Value, r.Err
}

func (b blocking) SetTenantWeight(ctx context.Context, tenant string, weight int) error {
	return <-b.t.SetTenantWeight(ctx, tenant, weight)
}

func (b blocking) Tenants(ctx context.Context) ([]pgtransport.TenantInfo, error) {
	r := <-b.t.Tenants(ctx)
	return r.Value, r.Err
}

func (b blocking) Work(ctx context.Context, cfg pgtransport.WorkerConfig, h pgtransport.Handler) error {
	return b.t.Work(ctx, cfg, h)
}
