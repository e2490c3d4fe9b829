package cluster

import (
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgtransport/pgtransport/internal/core"
)

// TestShares: every partition gets a share of the slots, at least one,
// the shares differ by one at most, and they add up to the slots (or to
// N, when there are fewer slots than partitions).
func TestShares(t *testing.T) {
	for _, n := range []int{1, 2, 4, 8} {
		for conc := 1; conc <= 40; conc++ {
			shares := (&Cluster{parts: make([]*core.Core, n)}).Shares(conc)
			total := 0
			for _, s := range shares {
				total += s
			}
			if len(shares) != n || slices.Min(shares) < 1 || slices.Max(shares)-slices.Min(shares) > 1 || total != max(conc, n) {
				t.Errorf("Shares(%d) over %d partitions = %v", conc, n, shares)
			}
		}
	}
}

// TestPartitionConfig: a partition is reached as the proxy DSN says, as
// PL/Proxy reaches it: the proxy's role (appended to the string, quoted),
// its password unless the string has one, its session settings where the
// string has none, its exec mode and pool size; the string's host,
// database and TLS.
func TestPartitionConfig(t *testing.T) {
	proxy, err := pgxpool.ParseConfig(`host=proxy dbname=q user='o\'brien\\x' password=secret application_name=app search_path=s pool_max_conns=7 default_query_exec_mode=exec`)
	if err != nil {
		t.Fatal(err)
	}
	c, err := partitionConfig(`host=db1 port=6543 dbname=queue search_path=other sslmode=disable`, proxy)
	if err != nil {
		t.Fatal(err)
	}
	cc := c.ConnConfig
	switch {
	case cc.Host != "db1" || cc.Port != 6543 || cc.Database != "queue":
		t.Errorf("the partition's address: %s:%d/%s", cc.Host, cc.Port, cc.Database)
	case cc.User != `o'brien\x` || cc.Password != "secret":
		t.Errorf("the proxy's role and password: %q %q", cc.User, cc.Password)
	case cc.RuntimeParams["application_name"] != "app" || cc.RuntimeParams["search_path"] != "other":
		t.Errorf("settings: %v (the proxy's where the partition's string sets none)", cc.RuntimeParams)
	case cc.DefaultQueryExecMode != pgx.QueryExecModeExec || c.MaxConns != 7:
		t.Errorf("exec mode %v, pool size %d: the proxy DSN's", cc.DefaultQueryExecMode, c.MaxConns)
	case cc.TLSConfig != nil:
		t.Error("TLS is the partition string's (sslmode=disable)")
	}
	c, err = partitionConfig(`host=db1 dbname=queue password=own`, proxy)
	if err != nil || c.ConnConfig.Password != "own" {
		t.Errorf("a password in the partition's string wins: %v %q", err, c.ConnConfig.Password)
	}
}
