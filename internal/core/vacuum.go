package core

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// vacuumDead is how many dead rows make Vacuum vacuum a table.
const vacuumDead = 1000

// Vacuum vacuums each queue table that has at least vacuumDead dead rows,
// by the statistics collector's count, and returns the tables it vacuumed.
func (c *Core) Vacuum(ctx context.Context) ([]string, error) {
	var done []string
	for _, table := range []string{"transport_groups", "transport_messages", "transport_waiters"} {
		name := pgx.Identifier{table}
		if c.cfg.Schema != "" {
			name = pgx.Identifier{c.cfg.Schema, table}
		}
		var dead int64
		err := c.db.QueryRow(ctx, `SELECT COALESCE(n_dead_tup, 0) FROM pg_stat_all_tables WHERE relid = $1::regclass`, name.Sanitize()).Scan(&dead)
		if err != nil {
			return done, mapErr("vacuum", err)
		}
		if dead < vacuumDead {
			continue
		}
		if _, err := c.db.Exec(ctx, "VACUUM "+name.Sanitize()); err != nil {
			return done, mapErr("vacuum", err)
		}
		done = append(done, table)
	}
	return done, nil
}
