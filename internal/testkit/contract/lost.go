package contract

import (
	"context"
	"errors"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

func init() { cases = append(cases, testCase{"LostReplies", lostReplies}) }

// lostReplies: each write's reply is lost after the server committed it
// (a pgtest.Proxy ends the connection where the reply would end, and drops
// any cancel request). Each call must say ErrOutcomeUnknown, never
// ErrLeaseLost ("changed nothing, will be redelivered"), and what the
// method's doc lets the caller assume must hold.
func lostReplies(is *is.I, e *env) {
	p := pgtest.NewProxy(e.t)
	tr := e.openOn(p.Pool(e.t, e.db, 8))
	lost := 0
	cut := func(match string) {
		p.CutAfterCommit(match)
		lost++
	}
	unknown := func(err error, what string) {
		e.t.Helper()
		if !errors.Is(err, pgtransport.ErrOutcomeUnknown) || errors.Is(err, pgtransport.ErrLeaseLost) {
			e.t.Fatalf("%s, its reply lost after the commit: %v; want ErrOutcomeUnknown", what, err)
		}
		if p.Lost() != lost {
			e.t.Fatalf("%s: the proxy lost %d replies, want %d", what, p.Lost(), lost)
		}
	}
	count := func(query string, args ...any) int { e.t.Helper(); return e.count(query, args...) }

	// Publish and PublishMany: applied (publishing again would add copies).
	cut("pub-lost")
	_, err := tr.Publish(e.ctx(), "g-pub", "pub-lost", 0)
	unknown(err, "Publish")
	is.Equal(count(`SELECT count(*) FROM transport_messages WHERE event = 'pub-lost'`), 1) // committed
	cut("many-lost")
	_, err = tr.PublishMany(e.ctx(), []pgtransport.Message{{Group: "g-pm", Event: "many-lost"}, {Group: "g-pm", Event: "many-2"}})
	unknown(err, "PublishMany")
	is.Equal(count(`SELECT count(*) FROM transport_messages WHERE group_id = 'g-pm'`), 2) // committed whole

	// Claim: a lease nobody holds; its group comes back after the visibility.
	cut("claimer-lost")
	l, err := tr.Claim(e.ctx(), "claimer-lost", time.Minute, 0)
	unknown(err, "Claim")
	is.Equal(l, nil)
	is.Equal(count(`SELECT count(*) FROM transport_groups WHERE locked_by LIKE 'claimer-lost:%'`), 1) // leased
	e.clock.Advance(2 * time.Minute)
	back, err := e.tr.ClaimMany(e.ctx(), "w", time.Minute, 0, 10)
	is.NoErr(err)
	is.Equal(len(back), 2) // g-pm came back, beside g-pub
	for _, b := range back {
		e.ack(b)
	}
	is.Equal(count(`SELECT count(*) FROM transport_messages WHERE group_id = 'g-pm'`), 1)
	e.ack(e.claim("w", 0))

	for _, g := range []string{"g-ack", "g-nack", "g-ext", "g-many1", "g-many2"} {
		e.publish(g, g, 0)
	}
	e.publish("g-next", "next-1", 0)
	e.publish("g-next", "next-2", 0)
	leases := map[string]*pgtransport.Lease{}
	all, err := e.tr.ClaimMany(e.ctx(), "w", time.Minute, 0, 10)
	is.NoErr(err)
	for _, l := range all {
		leases[l.Group] = l
	}
	is.Equal(len(leases), 6)

	// Ack: applied; the message is gone.
	cut("g-ack")
	unknown(tr.Ack(e.ctx(), leases["g-ack"]), "Ack")
	is.Equal(count(`SELECT count(*) FROM transport_messages WHERE group_id = 'g-ack'`), 0)

	// AckNext that keeps the group: asked again, it hands out the same
	// next message.
	cut("g-next")
	_, err = tr.AckNext(e.ctx(), leases["g-next"], time.Minute)
	unknown(err, "AckNext")
	next, err := tr.AckNext(e.ctx(), leases["g-next"], time.Minute)
	is.NoErr(err)                  // the retry of a keeping ack
	is.Equal(next.Event, "next-2") // the same next message

	// Nack: applied; the group is free.
	cut("g-nack")
	unknown(tr.Nack(e.ctx(), leases["g-nack"], 0), "Nack")
	is.Equal(count(`SELECT count(*) FROM transport_groups WHERE group_id = 'g-nack' AND locked_by IS NULL`), 1)

	// Extend: applied; the lease holds ten minutes from now.
	cut("g-ext")
	unknown(tr.Extend(e.ctx(), leases["g-ext"], 10*time.Minute), "Extend")
	now := float64(e.clock.Now().Unix())
	is.Equal(count(`SELECT count(*) FROM transport_groups WHERE group_id = 'g-ext' AND lock_expiry > $1::float8 + 300`, now), 1)

	// AckMany cut off by its ctx after its acks applied: the ctx ends
	// once the proxy holds the reply (a fixed deadline could end it
	// before the request reached the server, on a loaded machine).
	p.HoldAfterCommit("g-many1")
	lost++
	ctx, cancel := context.WithCancel(e.ctx())
	defer cancel()
	held := make(chan struct{})
	go func() {
		defer close(held)
		for p.Lost() < lost && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}()
	_, err = tr.AckMany(ctx, []*pgtransport.Lease{leases["g-many1"], leases["g-many2"]})
	cancel() // if AckMany returned before the proxy held its reply, the check below says so
	<-held
	unknown(err, "AckMany")
	is.True(errors.Is(err, context.Canceled)) // and ctx's error
	is.Equal(count(`SELECT count(*) FROM transport_messages WHERE group_id IN ('g-many1', 'g-many2')`), 0)
}
