package cluster_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/cluster"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// TestHashtextMatchesServer compares Hashtext with the server's hashtext
// over every length the hash treats apart (0 to 40 bytes: the 12-byte
// blocks and each tail length) and multi-byte UTF-8, on random strings.
func TestHashtextMatchesServer(t *testing.T) {
	is := is.New(t)
	db := pgtest.New(t, 2)
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_:/ éß€😀"
	runes := []rune(alphabet)
	var groups []string
	for n := 0; n <= 40; n++ {
		for range 25 {
			var b strings.Builder
			for range n {
				b.WriteRune(runes[rng.IntN(len(runes))])
			}
			groups = append(groups, b.String())
		}
	}
	var want []int32
	err := db.Pool.QueryRow(context.Background(), `SELECT array_agg(hashtext(g) ORDER BY i) FROM unnest($1::text[]) WITH ORDINALITY AS u(g, i)`, groups).Scan(&want)
	is.NoErr(err)
	is.Equal(len(want), len(groups))
	for i, g := range groups {
		if got := cluster.Hashtext(g); got != want[i] {
			t.Fatalf("Hashtext(%q) = %d, the server's hashtext %d", g, got, want[i])
		}
	}
}
