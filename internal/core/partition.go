package core

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgtransport/pgtransport"
)

// What package cluster asks of one partition's database.

// PartitionInfo is what a database records of its place in a partitioned
// queue (schema.Partition, schema's growth): its number, the partition
// count it was armed for while the cluster grows, and the count it grew
// from (nil: none), with the server's hashtext of the probe string.
type PartitionInfo struct {
	Part, Armed, GrownFrom *int32
	Hash                   int32
}

// Partition reads the partition record of c's database, hashing probe.
func (c *Core) Partition(ctx context.Context, probe string) (PartitionInfo, error) {
	return c.partitionOn(ctx, c.db, probe)
}

func (c *Core) partitionOn(ctx context.Context, db DBTX, probe string) (PartitionInfo, error) {
	var p PartitionInfo
	if err := db.QueryRow(ctx, c.q.partition, probe).Scan(&p.Part, &p.Armed, &p.GrownFrom, &p.Hash); err != nil {
		return p, mapErr("read the partition number", err)
	}
	return p, nil
}

// TxPartition is the partition number of tx's database, -1 for one that
// is not a partition. It looks first whether the database holds a queue
// at all (so a transaction elsewhere, on the proxy or the application's
// own database, is refused without an error that would abort it), then
// at the partition's number: two round-trips in tx.
func (c *Core) TxPartition(ctx context.Context, tx pgx.Tx) (int, error) {
	var isPart bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, c.q.partitionTable).Scan(&isPart); err != nil {
		return 0, mapErr("check the transaction's database", err)
	}
	if !isPart {
		return -1, nil
	}
	p, err := c.partitionOn(ctx, tx, "")
	if err != nil {
		return 0, fmt.Errorf("check the transaction's database: %w", err)
	}
	if p.Part == nil {
		return -1, nil
	}
	return int(*p.Part), nil
}

// SortIDs is ids sorted in the database's collation, as the partitions
// order group ids.
func (c *Core) SortIDs(ctx context.Context, ids []string) ([]string, error) {
	var sorted []string
	if err := c.db.QueryRow(ctx, `SELECT COALESCE(array_agg(g ORDER BY g), '{}') FROM unnest($1::text[]) AS u(g)`, ids).Scan(&sorted); err != nil {
		return nil, mapErr("sort group ids", err)
	}
	return sorted, nil
}

// MapErr is the one mapping of a database error to the package's
// sentinels (see mapErr), for package cluster's own round-trips.
func MapErr(op string, err error) error { return mapErr(op, err) }

// CheckBatch refuses a batch size out of 1..MaxBatch.
func CheckBatch(n int) error { return checkBatch(n) }

// CheckGroupQuery refuses a GroupQuery out of range.
func CheckGroupQuery(q pgtransport.GroupQuery) error { return checkGroupQuery(q) }
