package contract

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// publishCases: what a publish stores and what it refuses, one message or
// a batch, and that no publish is lost to an ack draining its group.
var publishCases = []testCase{
	{"FIFOWithinAGroup", fifoWithinAGroup},
	{"PublishKeepsLiveLeaseAndFirstPriority", publishKeepsLiveLeaseAndFirstPriority},
	{"BatchPublishKeepsOrderAndFirstPriority", batchPublishKeepsOrderAndFirstPriority},
	{"PublishManyPastMaxBatch", publishManyPastMaxBatch},
	{"BadInputIsRefusedAndWritesNothing", badInputIsRefusedAndWritesNothing},
	{"BatchBadInputWritesNothing", batchBadInputWritesNothing},
	{"PublishedAtIsByTheLocalClock", publishedAtIsByTheLocalClock},
	{"LostPublishRace", lostPublishRace},
	{"LostPublishRaceBatchAck", lostPublishRaceBatchAck},
}

func fifoWithinAGroup(is *is.I, e *env) {
	for i := range 5 {
		e.publish("g", event("g", i), 0)
	}
	for i := range 5 {
		l := e.claim("w", 0)
		is.True(l != nil)                // a message is claimable
		is.Equal(l.Event, event("g", i)) // delivered in publish order
		e.ack(l)
	}
	is.Equal(e.claim("w", 0), nil) // drained
}

func publishKeepsLiveLeaseAndFirstPriority(is *is.I, e *env) {
	e.publish("g", "a", 3)
	l := e.claim("w", 0)
	e.publish("g", "b", 0)
	is.Equal(e.claim("w2", 0), nil)                                                           // the publish did not free the leased group
	is.Equal(e.valueAt("g", `SELECT priority FROM transport_groups WHERE group_id = 'g'`), 3) // nor reset its priority
	e.ack(l)
	next := e.claim("w2", 3)
	is.Equal(next.Event, "b") // still at priority 3
}

// batchPublishKeepsOrderAndFirstPriority: a batch keeps order within
// groups and each group's first priority; its seqs follow slice order
// (on partitions, among one partition's: a and b are on two).
func batchPublishKeepsOrderAndFirstPriority(is *is.I, e *env) {
	g := e.spread("a", "b")
	a, b := g[0], g[1]
	seqs, err := e.tr.PublishMany(e.ctx(), []pgtransport.Message{
		{Group: a, Event: "a0", Priority: 2}, {Group: b, Event: "b0"}, {Group: a, Event: "a1", Priority: 4}, {Group: a, Event: "a2"},
	})
	is.NoErr(err)
	is.Equal(len(seqs), 4)
	is.True(e.risingPerPartition(seqs))                                                       // seqs in slice order
	is.Equal(e.partOf(seqs[0]), e.home(a))                                                    // each from its group's partition
	is.Equal(e.partOf(seqs[1]), e.home(b))                                                    //
	is.Equal(e.valueAt(a, `SELECT priority FROM transport_groups WHERE group_id = $1`, a), 2) // a's first message set it
	for _, want := range []string{"a0", "a1", "a2"} {
		l := e.claim("w", 2)
		is.Equal(l.Event, want) // FIFO within a
		e.ack(l)
	}
}

// publishManyPastMaxBatch: a batch of two chunks and a bit is stored
// whole, in slice order, with a dedup key honoured across chunks; one bad
// message at its end refuses it all, and nothing is written.
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
	is.NoErr(err)                                   // a long batch
	is.Equal(len(seqs), n)                          // a seq per message
	is.Equal(seqs[pgtransport.MaxBatch+8], seqs[1]) // the repeat's seq is the first one's
	stored := append(seqs[:pgtransport.MaxBatch+8:pgtransport.MaxBatch+8], seqs[pgtransport.MaxBatch+9:]...)
	is.True(e.risingPerPartition(stored)) // seqs follow slice order
	m, _ = e.rows()
	is.Equal(m, n-1) // every message but the repeat
}

func badInputIsRefusedAndWritesNothing(is *is.I, e *env) {
	e.publish("g", "m", 0)
	lease := e.claim("w", 0)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	bad := []struct {
		name string
		call func() error
		want error
	}{
		{"EmptyGroup", pub(e, "", "x", 0), pgtransport.ErrInvalidGroup},
		{"NULInGroup", pub(e, "a\x00b", "x", 0), pgtransport.ErrInvalidGroup},
		{"InvalidUTF8Group", pub(e, "a\xffb", "x", 0), pgtransport.ErrInvalidGroup},
		{"GroupTooLong", pub(e, strings.Repeat("g", pgtransport.MaxGroupBytes+1), "x", 0), pgtransport.ErrInvalidGroup},
		{"NULInEvent", pub(e, "h", "x\x00", 0), pgtransport.ErrInvalidEvent},
		{"InvalidUTF8Event", pub(e, "h", "\xc3\x28", 0), pgtransport.ErrInvalidEvent},
		{"EventTooLarge", pub(e, "h", strings.Repeat("e", pgtransport.DefaultMaxEventBytes+1), 0), pgtransport.ErrEventTooLarge},
		{"PriorityMinus1", pub(e, "h", "x", -1), pgtransport.ErrInvalidPriority},
		{"Priority5", pub(e, "h", "x", 5), pgtransport.ErrInvalidPriority},
		{"CancelledPublish", func() error { _, err := e.tr.Publish(cancelled, "h", "x", 0); return err }, context.Canceled},
		{"EmptyWorker", claimErr(e, context.Background(), "", time.Second, 0), pgtransport.ErrInvalidWorkerID},
		{"NULWorker", claimErr(e, context.Background(), "w\x00", time.Second, 0), pgtransport.ErrInvalidWorkerID},
		{"ZeroVisibility", claimErr(e, context.Background(), "w", 0, 0), pgtransport.ErrInvalidVisibility},
		{"NegativeVisibility", claimErr(e, context.Background(), "w", -time.Second, 0), pgtransport.ErrInvalidVisibility},
		{"ClaimPriority9", claimErr(e, context.Background(), "w", time.Second, 9), pgtransport.ErrInvalidPriority},
		{"CancelledClaim", claimErr(e, cancelled, "w", time.Second, 0), context.Canceled},
		{"NilLeaseAck", func() error { return e.tr.Ack(e.ctx(), nil) }, pgtransport.ErrNilLease},
		{"NilLeaseNack", func() error { return e.tr.Nack(e.ctx(), nil, 0) }, pgtransport.ErrNilLease},
		{"NilLeaseExtend", func() error { return e.tr.Extend(e.ctx(), nil, time.Second) }, pgtransport.ErrNilLease},
		{"NegativeDelay", func() error { return e.tr.Nack(e.ctx(), lease, -time.Second) }, pgtransport.ErrInvalidDelay},
		{"ZeroExtend", func() error { return e.tr.Extend(e.ctx(), lease, 0) }, pgtransport.ErrInvalidVisibility},
		{"CancelledAck", func() error { return e.tr.Ack(cancelled, lease) }, context.Canceled},
		{"ForgedToken", func() error {
			forged := *lease
			forged.Token = "w:forged"
			return e.tr.Ack(e.ctx(), &forged)
		}, pgtransport.ErrLeaseLost},
	}
	for _, b := range bad {
		e.t.Run(b.name, func(t *testing.T) {
			if err := b.call(); !errors.Is(err, b.want) {
				t.Errorf("got %v, want %v", err, b.want)
			}
		})
	}
	m, g := e.rows()
	is.Equal(m, 1) // nothing written, nothing deleted
	is.Equal(g, 1)
	is.NoErr(e.tr.Ack(e.ctx(), lease)) // the real lease still holds
}

// batchBadInputWritesNothing: every batch call refuses bad input before
// anything is written; a batch's bad message is named by its place, and
// refuses the whole batch, whatever partitions its groups are on.
func batchBadInputWritesNothing(is *is.I, e *env) {
	_, err := e.tr.PublishMany(e.ctx(), nil)
	is.True(errors.Is(err, pgtransport.ErrInvalidBatch))
	_, err = e.tr.PublishMany(e.ctx(), []pgtransport.Message{{Group: "ok", Event: "1"}, {Group: "", Event: "2"}})
	is.True(errors.Is(err, pgtransport.ErrInvalidGroup))
	_, err = e.tr.PublishMany(e.ctx(), []pgtransport.Message{{Group: "ok", Event: "1"}, {Group: "ok", Event: "2", Priority: 9}})
	is.True(errors.Is(err, pgtransport.ErrInvalidPriority))
	_, err = e.tr.PublishMany(e.ctx(), make([]pgtransport.Message, pgtransport.MaxBatch+1))
	is.True(errors.Is(err, pgtransport.ErrInvalidGroup)) // a batch past MaxBatch is checked whole too
	var msgs []pgtransport.Message
	for m := range 20 {
		msgs = append(msgs, pgtransport.Message{Group: fmt.Sprint("x", m), Event: "ok"}) // on every partition
	}
	msgs[17].Event = "bad\x00"
	_, err = e.tr.PublishMany(e.ctx(), msgs)
	is.True(errors.Is(err, pgtransport.ErrInvalidEvent))
	is.True(strings.Contains(err.Error(), "message 17")) // named by its place
	_, err = e.tr.ClaimMany(e.ctx(), "w", time.Minute, 0, 0)
	is.True(errors.Is(err, pgtransport.ErrInvalidBatch))
	_, err = e.tr.ClaimMany(e.ctx(), "", time.Minute, 0, 1)
	is.True(errors.Is(err, pgtransport.ErrInvalidWorkerID))
	_, err = e.tr.AckMany(e.ctx(), []*pgtransport.Lease{nil})
	is.True(errors.Is(err, pgtransport.ErrNilLease))
	_, err = e.tr.AckMany(e.ctx(), []*pgtransport.Lease{{Group: "x1", Seq: 1, Token: "w:t"}, nil})
	is.True(errors.Is(err, pgtransport.ErrNilLease)) // after a lease that could be sent
	_, err = e.tr.AckMany(e.ctx(), nil)
	is.True(errors.Is(err, pgtransport.ErrInvalidBatch))
	_, err = e.tr.AckNext(e.ctx(), nil, time.Minute)
	is.True(errors.Is(err, pgtransport.ErrNilLease))
	m, g := e.rows()
	is.Equal(m+g, 0) // nothing written
}

// publishedAtIsByTheLocalClock: a lease's PublishedAt is when the message
// was published by this process's clock, whatever the clock the
// statements use (the case's is years off); zero when unknown. AckNext
// keeps g while no other group waits: h and p are published after it, and
// then handed out in arrival order (on partitions among one partition's,
// which g, h and p share).
func publishedAtIsByTheLocalClock(is *is.I, e *env) {
	gs := e.local("g", "h", "p")
	g, h, p := gs[0], gs[1], gs[2]
	before := time.Now()
	e.publish(g, "g1", 0)
	e.publish(g, "g2", 0)
	after := time.Now()
	within := func(l *pgtransport.Lease, what string) {
		e.t.Helper()
		if l == nil {
			e.t.Fatalf("%s: no lease", what)
		}
		if l.PublishedAt.Before(before.Add(-time.Second)) || l.PublishedAt.After(after.Add(time.Second)) {
			e.t.Errorf("%s: PublishedAt %v, want within a second of [%v, %v]", what, l.PublishedAt, before, after)
		}
	}
	l := e.claim("w", 0)
	within(l, "Claim")
	next, err := e.tr.AckNext(e.ctx(), l, time.Minute)
	is.NoErr(err)
	within(next, "AckNext") // a kept lease
	e.publish(h, "h1", 0)
	e.execAt(p, `INSERT INTO transport_messages (group_id, event) VALUES ($1, 'plain')`, p) // the design's two-INSERT publish
	e.execAt(p, `INSERT INTO transport_groups (group_id) VALUES ($1) ON CONFLICT DO NOTHING`, p)
	after = time.Now()
	e.ack(next)
	ls, err := e.tr.ClaimMany(e.ctx(), "w", time.Minute, 0, 1)
	is.NoErr(err)
	is.Equal(len(ls), 1)
	within(ls[0], "ClaimMany")
	e.ack(ls[0])
	l, err = e.tr.ClaimWait(e.ctx(), "w", time.Minute, 0)
	is.NoErr(err)
	within(l, "ClaimWait (a plain-SQL publish)")
	e.ack(l)

	// An hour-old message says so.
	e.publish("old", "o1", 0)
	e.exec(`UPDATE transport_messages SET published_at = published_at - interval '1 hour'`)
	l = e.claim("w", 0)
	if d := time.Since(l.PublishedAt); d < time.Hour-time.Second || d > time.Hour+5*time.Second {
		e.t.Errorf("an hour-old message: PublishedAt %v ago", d)
	}
	e.ack(l)

	// Queued before the column existed: unknown.
	e.publish("old", "o2", 0)
	e.exec(`UPDATE transport_messages SET published_at = NULL`)
	l = e.claim("w", 0)
	is.True(l.PublishedAt.IsZero())
	e.ack(l)
}

// raceRoundsOn is how many rounds raceRounds runs on n partitions. The
// race is between the functions of one database, the group's home: one
// database runs the full count, which found the lost publish by round 3
// before the guard; partitions run the same functions behind the
// routing, which adds no interleaving of its own, so a tenth checks the
// race through the routing at a tenth of the cost (each round's claims
// try up to four partitions).
func raceRoundsOn(n, rounds int) int {
	if n > 1 {
		return rounds / 10
	}
	return rounds
}

// lostPublishRace: a publish during a draining ack never strands a message.
func lostPublishRace(is *is.I, e *env) {
	is.NoErr(raceRounds(e, raceRoundsOn(e.n, 2000), e.tr.Ack))                                                                                          // every round delivered the racing publish
	is.Equal(e.count(`SELECT count(*) FROM transport_messages m WHERE NOT EXISTS (SELECT 1 FROM transport_groups g WHERE g.group_id = m.group_id)`), 0) // no message without a group row
	m, g := e.rows()
	is.Equal(m+g, 0)
}

// lostPublishRaceBatchAck: a publish during a draining AckMany never
// strands a message.
func lostPublishRaceBatchAck(is *is.I, e *env) {
	is.NoErr(raceRounds(e, raceRoundsOn(e.n, 1000), func(ctx context.Context, l *pgtransport.Lease) error {
		errs, err := e.tr.AckMany(ctx, []*pgtransport.Lease{l})
		if err != nil {
			return err
		}
		return errs[0]
	}))
	m, g := e.rows()
	is.Equal(m+g, 0)
}

// raceRounds publishes m1 to a group, claims it, then acks it (with ack)
// while another goroutine publishes m2 to the same group; m2 must then be
// claimable.
func raceRounds(e *env, rounds int, ack func(context.Context, *pgtransport.Lease) error) error {
	ctx := e.ctx()
	for r := range rounds {
		group := fmt.Sprintf("race-%d", r)
		if _, err := e.tr.Publish(ctx, group, "m1", 0); err != nil {
			return err
		}
		l, err := e.tr.Claim(ctx, "w", time.Minute, 0)
		if err != nil || l == nil || l.Group != group {
			return fmt.Errorf("round %d: claim %v %v", r, l, err)
		}
		pubErr := make(chan error, 1)
		go func() {
			_, err := e.tr.Publish(ctx, group, "m2", 0)
			pubErr <- err
		}()
		if err := ack(ctx, l); err != nil {
			return fmt.Errorf("round %d: ack: %w", r, err)
		}
		if err := <-pubErr; err != nil {
			return fmt.Errorf("round %d: publish: %w", r, err)
		}
		l2, err := e.tr.Claim(ctx, "w", time.Minute, 0)
		if err != nil {
			return err
		}
		if l2 == nil {
			return fmt.Errorf("round %d: m2 was stranded: no claimable group; tables: %s; lease %+v", r, e.snapshot(), l)
		}
		if l2.Group != group || l2.Event != "m2" {
			return fmt.Errorf("round %d: got %s/%s, want %s/m2", r, l2.Group, l2.Event, group)
		}
		if err := e.tr.Ack(ctx, l2); err != nil {
			return err
		}
	}
	return nil
}

func pub(e *env, group, ev string, priority int) func() error {
	return func() error { _, err := e.tr.Publish(e.ctx(), group, ev, priority); return err }
}

func claimErr(e *env, ctx context.Context, worker string, vis time.Duration, minPriority int) func() error {
	return func() error { _, err := e.tr.Claim(ctx, worker, vis, minPriority); return err }
}
