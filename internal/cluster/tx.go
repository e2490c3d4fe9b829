package cluster

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
)

// Begin begins a transaction on partition i (a TxHandler's, say).
func (cl *Cluster) Begin(ctx context.Context, i int) (pgx.Tx, error) { return cl.parts[i].Begin(ctx) }

// CheckTx is what a call in the caller's transaction tx on partition i
// checks before it sends anything: first its own arguments (pre, the
// error of their check, so bad input is refused as on one database), then
// the transaction. It refuses (ErrInvalidConfig) one that is not on
// partition i's database: a message published there would be out of its
// group's order, a lease acked there not found.
func (cl *Cluster) CheckTx(ctx context.Context, tx pgx.Tx, i int, pre error) error {
	if pre != nil {
		return pre
	}
	if tx == nil || len(cl.parts) == 1 {
		return nil // one partition: any database is it; nil: the call refuses it
	}
	p, err := cl.txPart(ctx, tx)
	if err != nil {
		return err
	}
	if p != i {
		return notOn(i)
	}
	return nil
}

// CheckPublishTx is CheckTx for a publish of group in tx, and returns the
// partition to publish on. A moving group's old home takes the
// transaction as it is: its fence refuses the message (ErrGroupMoved) if
// the group has left. Its new home takes it once the old one's fence says
// the group has left (Core.Left: a decision that holds, where Locate's
// look does not).
func (cl *Cluster) CheckPublishTx(ctx context.Context, tx pgx.Tx, group string, pre error) (int, error) {
	if pre != nil || !cl.Moves(group) || tx == nil {
		i := cl.Home(group)
		return i, cl.CheckTx(ctx, tx, i, pre)
	}
	p, err := cl.txPart(ctx, tx)
	if err != nil {
		return 0, err
	}
	old := cl.first(group)
	if p == old {
		return p, nil
	}
	left, err := cl.parts[old].Left(ctx, []string{group})
	if err != nil {
		return 0, fmt.Errorf("partition %d: %w", old, err)
	}
	if len(left) == 0 {
		return 0, notOn(old)
	}
	if home := cl.Home(group); p != home {
		return 0, notOn(home)
	}
	return p, nil
}

// notOn is the refusal of a transaction that is not on partition i.
func notOn(i int) error {
	return fmt.Errorf("%w: the transaction is not on the database of partition %d, where the group lives (Transport.Locate)", pgtransport.ErrInvalidConfig, i)
}

// txPart is the partition number of tx's database, -1 for one that is
// not a partition (core.Core.TxPartition).
func (cl *Cluster) txPart(ctx context.Context, tx pgx.Tx) (int, error) {
	return cl.parts[0].TxPartition(ctx, tx)
}

// TxLease is the Core a call about lease l in the caller's transaction tx
// runs on: l's partition, once tx is checked to be on its database
// (CheckTx, after l's own check). With one partition, at once.
func (cl *Cluster) TxLease(ctx context.Context, tx pgx.Tx, l *pgtransport.Lease) (*core.Core, error) {
	if c := cl.one(); c != nil {
		return c, nil
	}
	i := cl.Of(l)
	if err := cl.CheckTx(ctx, tx, i, core.CheckLease(l)); err != nil {
		return nil, err
	}
	return cl.parts[i], nil
}

// TxPublish is the Core a publish of m in tx runs on (CheckPublishTx,
// after m's own check). With one partition, at once.
func (cl *Cluster) TxPublish(ctx context.Context, tx pgx.Tx, m pgtransport.Message) (*core.Core, error) {
	if c := cl.one(); c != nil {
		return c, nil
	}
	i, err := cl.CheckPublishTx(ctx, tx, m.Group, cl.parts[0].CheckMessage(m))
	if err != nil {
		return nil, err
	}
	return cl.parts[i], nil
}

// TxGroup is the Core a read of group's state in tx runs on: the
// partition that holds group (Locate), once tx is checked to be on its
// database. With one partition, at once.
func (cl *Cluster) TxGroup(ctx context.Context, tx pgx.Tx, group string) (*core.Core, error) {
	if c := cl.one(); c != nil {
		return c, nil
	}
	pre := core.CheckGroup(group)
	i := cl.Home(group)
	if pre == nil && cl.Moves(group) {
		var err error
		if i, err = cl.Locate(ctx, group); err != nil {
			return nil, err
		}
	}
	if err := cl.CheckTx(ctx, tx, i, pre); err != nil {
		return nil, err
	}
	return cl.parts[i], nil
}
