package contract

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	stdsync "sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// dedupCases: a message's DedupKey stores it once within the window, per
// group, in a batch and in the caller's transaction.
var dedupCases = []testCase{
	{"DedupKeyStoresOnce", dedupKeyStoresOnce},
	{"DedupKeyConcurrentPublishesStoreOnce", dedupKeyConcurrentPublishesStoreOnce},
	{"DedupKeyInPublishMany", dedupKeyInPublishMany},
	{"DedupKeyInCallersTransaction", dedupKeyInCallersTransaction},
	{"DedupKeyExpiresAfterWindow", dedupKeyExpiresAfterWindow},
	{"BadDedupKeyWritesNothing", badDedupKeyWritesNothing},
}

// dedupKeyStoresOnce: a (group, key) seen within the window stores
// nothing and answers the original seq, even once that message is acked;
// keys are per group; messages without a key are never deduplicated.
func dedupKeyStoresOnce(is *is.I, e *env) {
	s1 := e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "first", Priority: 3, DedupKey: "k"})
	is.Equal(e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "second", DedupKey: "k"}), s1)
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 1)
	is.Equal(e.valueAt("g", `SELECT priority FROM transport_groups WHERE group_id = 'g'`), 3) // PublishMessage's priority
	s2 := e.publishMessage(e.tr, pgtransport.Message{Group: "h", Event: "other group", DedupKey: "k"})
	is.True(s2 != s1) // a key is per group
	n1 := e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "no key"})
	n2 := e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "no key"})
	is.True(n1 != n2) // no key, no dedup
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 4)
	l := e.claim("w", 3)
	is.Equal(l.Event, "first")
	e.ack(l)
	is.Equal(e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "after ack", DedupKey: "k"}), s1) // still seen
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 3)
}

// dedupKeyConcurrentPublishesStoreOnce: eight publishes of one key at once
// store one message and all answer its seq.
func dedupKeyConcurrentPublishesStoreOnce(is *is.I, e *env) {
	const rounds, publishers = 10, 8
	type result struct {
		seq int64
		err error
	}
	trs := make([]Transport, publishers)
	for i := range trs {
		trs[i] = e.open()
	}
	for r := range rounds {
		key := fmt.Sprint("k", r)
		start := make(chan struct{})
		results := make(chan result, publishers)
		var wg stdsync.WaitGroup
		for i, tr := range trs {
			wg.Go(func() {
				<-start
				s, err := tr.PublishMessage(e.ctx(), pgtransport.Message{Group: "g", Event: event(key, i), DedupKey: key})
				results <- result{s, err}
			})
		}
		close(start)
		wg.Wait()
		close(results)
		var seqs []int64
		for res := range results {
			is.NoErr(res.err)
			seqs = append(seqs, res.seq)
		}
		is.Equal(len(slices.Compact(slices.Sorted(slices.Values(seqs)))), 1) // one seq for all
		is.Equal(e.count(`SELECT count(*) FROM transport_messages WHERE seq = $1`, seqs[0]), 1)
	}
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), rounds) // one message per key
}

// dedupKeyInPublishMany: a batch stores each (group, key) once, answering
// the first's seq for its repeats, in input order; keys stored by one
// call hold off the next.
func dedupKeyInPublishMany(is *is.I, e *env) {
	seqs, err := e.tr.PublishMany(e.ctx(), []pgtransport.Message{
		{Group: "g", Event: "a", DedupKey: "k1"},
		{Group: "g", Event: "b", DedupKey: "k2"},
		{Group: "g", Event: "c", DedupKey: "k1"},
		{Group: "h", Event: "d", DedupKey: "k1"},
		{Group: "g", Event: "e"},
		{Group: "g", Event: "f"},
	})
	is.NoErr(err)
	is.Equal(len(seqs), 6)
	is.Equal(seqs[2], seqs[0]) // the repeat answers the first
	is.Equal(len(slices.Compact(slices.Sorted(slices.Values(seqs)))), 5)
	is.Equal(e.count(`SELECT count(*) FROM transport_messages`), 5)
	again, err := e.tr.PublishMany(e.ctx(), []pgtransport.Message{
		{Group: "g", Event: "x", DedupKey: "k2"},
		{Group: "g", Event: "y", DedupKey: "k3"},
	})
	is.NoErr(err)
	is.Equal(again[0], seqs[1]) // seen in the earlier batch
	is.Equal(e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "z", DedupKey: "k3"}), again[1])
	is.Equal(e.textAt("g", `SELECT string_agg(event, ',' ORDER BY seq) FROM transport_messages WHERE group_id = 'g'`), "a,b,e,f,y") // FIFO of what was stored
}

// dedupKeyInCallersTransaction: a key stored in a transaction that rolls
// back holds nothing off, a publish of a key another transaction holds
// uncommitted waits for its outcome, and a committed one holds.
func dedupKeyInCallersTransaction(is *is.I, e *env) {
	begin := func() pgx.Tx { e.t.Helper(); return e.begin("g") }
	tx := begin()
	s1, err := e.tr.PublishMessageTx(e.ctx(), tx, pgtransport.Message{Group: "g", Event: "rolled back", DedupKey: "k"})
	is.NoErr(err)
	is.NoErr(tx.Rollback(e.ctx()))
	s2 := e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "kept", DedupKey: "k"})
	is.True(s2 != s1) // stored: the rolled-back key held nothing off
	is.Equal(e.textAt("g", `SELECT string_agg(event, ',') FROM transport_messages`), "kept")

	tx = begin()
	dup, err := e.tr.PublishMessageTx(e.ctx(), tx, pgtransport.Message{Group: "g", Event: "dup", DedupKey: "k"})
	is.NoErr(err)
	is.Equal(dup, s2) // a committed key holds inside a transaction too
	is.NoErr(tx.Commit(e.ctx()))

	// A key held by a transaction still open: the other publish waits for
	// it, and stores its own message once it rolls back.
	tx = begin()
	_, err = e.tr.PublishMessageTx(e.ctx(), tx, pgtransport.Message{Group: "g", Event: "pending", DedupKey: "k2"})
	is.NoErr(err)
	type result struct {
		seq int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := e.tr.PublishMessage(e.ctx(), pgtransport.Message{Group: "g", Event: "waited", DedupKey: "k2"})
		done <- result{s, err}
	}()
	e.waitLocked("harel_publish_keyed(")
	is.NoErr(tx.Rollback(e.ctx()))
	select {
	case res := <-done:
		is.NoErr(res.err)
		is.Equal(e.count(`SELECT count(*) FROM transport_messages WHERE seq = $1 AND event = 'waited'`, res.seq), 1) // its own, stored
	case <-time.After(30 * time.Second):
		e.t.Fatal("the waiting publish never returned")
	}

	tx = begin()
	s3, err := e.tr.PublishMessageTx(e.ctx(), tx, pgtransport.Message{Group: "g", Event: "committed", DedupKey: "k3"})
	is.NoErr(err)
	is.NoErr(tx.Commit(e.ctx()))
	is.Equal(e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "later", DedupKey: "k3"}), s3)
	is.Equal(e.textAt("g", `SELECT string_agg(event, ',' ORDER BY seq) FROM transport_messages`), "kept,waited,committed")
}

// dedupKeyExpiresAfterWindow: once DedupWindow has passed, the key holds
// nothing off (real time: the window is by the server's clock).
func dedupKeyExpiresAfterWindow(is *is.I, e *env) {
	const window = time.Second
	tr := e.with(pgtransport.Config{DedupWindow: window})
	start := time.Now()
	s1 := e.publishMessage(tr, pgtransport.Message{Group: "g", Event: "1", DedupKey: "k"})
	is.Equal(e.publishMessage(tr, pgtransport.Message{Group: "g", Event: "2", DedupKey: "k"}), s1) // within the window
	for {
		s := e.publishMessage(tr, pgtransport.Message{Group: "g", Event: "3", DedupKey: "k"})
		if s != s1 {
			break
		}
		if time.Since(start) > 15*time.Second {
			e.t.Fatal("the key never expired")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if took := time.Since(start); took < window {
		e.t.Errorf("the key expired after %v, within its window of %v", took, window)
	}
	is.Equal(e.textAt("g", `SELECT string_agg(event, ',' ORDER BY seq) FROM transport_messages`), "1,3")
}

// badDedupKeyWritesNothing: a dedup key too long, not UTF-8 or with a
// NUL is refused by every publish, before anything is written; so are the
// other bad fields of a Message and a Fail without a lease.
func badDedupKeyWritesNothing(is *is.I, e *env) {
	tx := e.begin("g")
	keys := map[string]string{
		"TooLong":     strings.Repeat("k", pgtransport.MaxDedupKeyBytes+1),
		"InvalidUTF8": "a\xffb",
		"NUL":         "a\x00b",
	}
	for name, key := range keys {
		msg := pgtransport.Message{Group: "g", Event: "x", DedupKey: key}
		if _, err := e.tr.PublishMessage(e.ctx(), msg); !errors.Is(err, pgtransport.ErrInvalidDedupKey) {
			e.t.Errorf("PublishMessage, key %s: got %v, want ErrInvalidDedupKey", name, err)
		}
		if _, err := e.tr.PublishMessageTx(e.ctx(), tx, msg); !errors.Is(err, pgtransport.ErrInvalidDedupKey) {
			e.t.Errorf("PublishMessageTx, key %s: got %v, want ErrInvalidDedupKey", name, err)
		}
		if _, err := e.tr.PublishMany(e.ctx(), []pgtransport.Message{{Group: "g", Event: "fine", DedupKey: "fine"}, msg}); !errors.Is(err, pgtransport.ErrInvalidDedupKey) {
			e.t.Errorf("PublishMany, key %s: got %v, want ErrInvalidDedupKey", name, err)
		}
	}
	others := map[string]struct {
		msg  pgtransport.Message
		want error
	}{
		"EmptyGroup": {pgtransport.Message{Event: "x", DedupKey: "k"}, pgtransport.ErrInvalidGroup},
		"NULEvent":   {pgtransport.Message{Group: "g", Event: "\x00", DedupKey: "k"}, pgtransport.ErrInvalidEvent},
		"Priority9":  {pgtransport.Message{Group: "g", Event: "x", Priority: 9, DedupKey: "k"}, pgtransport.ErrInvalidPriority},
	}
	for name, o := range others {
		if _, err := e.tr.PublishMessage(e.ctx(), o.msg); !errors.Is(err, o.want) {
			e.t.Errorf("PublishMessage, %s: got %v, want %v", name, err, o.want)
		}
	}
	is.True(errors.Is(e.tr.Fail(e.ctx(), nil, errors.New("x")), pgtransport.ErrNilLease))
	is.NoErr(tx.Commit(e.ctx()))
	m, g := e.rows()
	is.Equal(m+g, 0) // nothing written
	is.Equal(e.count(`SELECT count(*) FROM transport_dedup`), 0)
	e.publishMessage(e.tr, pgtransport.Message{Group: "g", Event: "x", DedupKey: strings.Repeat("k", pgtransport.MaxDedupKeyBytes)}) // the limit itself is fine
	is.Equal(e.count(`SELECT count(*) FROM transport_dedup`), 1)
}
