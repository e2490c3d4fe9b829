package core

import (
	"testing"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// TestKeepFor: what an ack asks of the database for a lease that has been
// kept k times in a row ("A keep yields" in
// schema/sql/functions/40_ack.sql): keep (true) for its first
// KeepWhileWaiting messages, then keep only while no group waits (NULL),
// and free (false) once it has taken MaxKeep.
func TestKeepFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name            string
		maxKeep, whileW int
		want            string // per Kept = 0, 1, ...: t(rue), n(ull), f(alse)
	}{
		{"Defaults", 0, 0, "tttnnnnnnnnnnnnf"},
		{"YieldAtOnce", 0, 1, "nnnnnnnnnnnnnnnf"},
		{"NeverYield", 0, pgtransport.DefaultMaxKeep, "tttttttttttttttf"},
		{"AboveMaxKeep", 4, 9, "tttf"},
		{"NeverKeep", -1, 0, "f"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			cfg, err := Defaults(pgtransport.Config{MaxKeep: tc.maxKeep, KeepWhileWaiting: tc.whileW})
			is.NoErr(err)
			c := &Core{cfg: cfg}
			got := ""
			for kept := range len(tc.want) {
				switch k := c.keepFor(&pgtransport.Lease{Kept: kept}); {
				case k == nil:
					got += "n"
				case *k:
					got += "t"
				default:
					got += "f"
				}
			}
			is.Equal(got, tc.want) // true, then NULL, then false
		})
	}
}
