package core

import (
	"slices"
	"testing"
)

// TestShares: every partition gets a share of the slots, at least one,
// the shares differ by one at most, and they add up to the slots (or to
// N, when there are fewer slots than partitions).
func TestShares(t *testing.T) {
	for _, n := range []int{1, 2, 4, 8} {
		for conc := 1; conc <= 40; conc++ {
			shares := (&Cluster{parts: make([]*Core, n)}).Shares(conc)
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
