package contract

import (
	"errors"
	"fmt"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// The case of issue 14's item 8: PublishMany takes a batch past MaxBatch,
// in chunks inside one transaction, with the guarantees of a short one.
func init() {
	cases = append(cases, testCase{"PublishManyPastMaxBatch", publishManyPastMaxBatch})
}

// publishManyPastMaxBatch: a batch of two chunks and a bit is stored whole,
// in slice order, with a dedup key honoured across chunks; one bad message
// at its end refuses it all, and nothing is written.
func publishManyPastMaxBatch(is *is.I, e *env) {
	n := 2*pgtransport.MaxBatch + 3
	msgs := make([]pgtransport.Message, n)
	for i := range msgs {
		msgs[i] = pgtransport.Message{Group: fmt.Sprint("g", i%7), Event: fmt.Sprint(i)}
	}
	msgs[1].DedupKey = "k"                            // in the first chunk
	msgs[pgtransport.MaxBatch+8] = msgs[1]            // the same group and key in the second: a repeat
	msgs[pgtransport.MaxBatch+8].Event = "not stored" // (its own event)
	bad := append(append([]pgtransport.Message(nil), msgs...), pgtransport.Message{Group: ""})
	_, err := e.tr.PublishMany(e.ctx(), bad)
	is.True(errors.Is(err, pgtransport.ErrInvalidGroup)) // the last message refuses the batch
	m, g := e.rows()
	is.Equal(m+g, 0) // nothing written

	seqs, err := e.tr.PublishMany(e.ctx(), msgs)
	is.NoErr(err)          // a long batch
	is.Equal(len(seqs), n) // a seq per message
	for i := 1; i < n; i++ {
		if i == pgtransport.MaxBatch+8 {
			is.Equal(seqs[i], seqs[1]) // the repeat's seq is the first one's
			continue
		}
		if seqs[i] <= seqs[i-1] && i-1 != pgtransport.MaxBatch+8 {
			is.Fail() // seqs follow slice order
		}
	}
	m, _ = e.rows()
	is.Equal(m, n-1) // every message but the repeat
}
