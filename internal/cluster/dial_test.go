package cluster

import (
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// TestConnectPoolSize: a pool FromDSN opens holds DefaultPoolSize
// connections unless the dsn names its size, in either dsn form.
func TestConnectPoolSize(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	for _, tc := range []struct {
		name string
		dsn  string
		want int32
	}{
		{"Default", dsn, pgtransport.DefaultPoolSize},
		{"SetSmaller", withParam(dsn, "pool_max_conns", "3"), 3},
		{"SetLarger", withParam(dsn, "pool_max_conns", "40"), 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			pool, _, err := Connect(pgtest.Context(t), tc.dsn, pgtransport.Config{})
			is.NoErr(err) // connect
			defer pool.Close()
			is.Equal(pool.Config().MaxConns, tc.want) // the pool's size
		})
	}
	is := is.New(t)
	is.True(setsPoolSize("host=h pool_max_conns=2"))            // keyword/value form
	is.True(setsPoolSize("postgres://h/d?pool_max_conns=2"))    // URL form
	is.True(!setsPoolSize("postgres://h/d?application_name=x")) // not set
}

// withParam adds key=value to dsn, a URL or a keyword/value string.
func withParam(dsn, key, value string) string {
	if !strings.Contains(dsn, "://") {
		return dsn + " " + key + "=" + value
	}
	if strings.Contains(dsn, "?") {
		return dsn + "&" + key + "=" + value
	}
	return dsn + "?" + key + "=" + value
}
