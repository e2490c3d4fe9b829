package contract

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// lostRepliesCases: what a write whose reply is lost after the commit
// tells its caller.
var lostRepliesCases = []testCase{
	{"EveryWriteSaysOutcomeUnknown", everyWriteSaysOutcomeUnknown},
}

// lossy is another transport on the case's queue whose connections go
// through a pgtest.Proxy in front of each partition (one, on one
// database), so that a loss is armed on the partition a call goes to.
type lossy struct {
	e       *env
	tr      Transport
	proxies []*pgtest.Proxy
	armed   int
}

func (e *env) lossy() *lossy {
	e.t.Helper()
	l := &lossy{e: e}
	pools := make([]*pgxpool.Pool, e.n)
	for i := range pools {
		dsn := ""
		if e.db != nil {
			dsn = e.db.DSN
		} else {
			dsn = e.p.PartDSNs[i]
		}
		p := pgtest.NewProxy(e.t)
		l.proxies = append(l.proxies, p)
		pools[i] = p.PoolOn(e.t, dsn, e.schema, 8)
	}
	l.tr = e.must(e.openOn(pools, e.config()))
	return l
}

// cut arms a loss (Proxy.CutAfterCommit) on group's home partition.
func (l *lossy) cut(group, match string) {
	l.proxies[l.e.home(group)].CutAfterCommit(match)
	l.armed++
}

// hold arms a held reply (Proxy.HoldAfterCommit) on group's home
// partition.
func (l *lossy) hold(group, match string) {
	l.proxies[l.e.home(group)].HoldAfterCommit(match)
	l.armed++
}

// lost is how many replies the proxies have cut or held.
func (l *lossy) lost() int {
	n := 0
	for _, p := range l.proxies {
		n += p.Lost()
	}
	return n
}

// everyWriteSaysOutcomeUnknown: each write's reply is lost after the
// server committed it (a pgtest.Proxy ends the connection where the reply
// would end, and drops any cancel request). Each call must say
// ErrOutcomeUnknown, never ErrLeaseLost ("changed nothing, will be
// redelivered"), and what the method's doc lets the caller assume must
// hold. On partitions a claim whose reply is lost on one partition goes
// on to the others, and returns a lease if one of them leases: here the
// only groups are on the partition whose reply is lost, so the claim
// has nothing else to return.
func everyWriteSaysOutcomeUnknown(is *is.I, e *env) {
	lp := e.lossy()
	tr := lp.tr
	unknown := func(err error, what string) {
		e.t.Helper()
		if !errors.Is(err, pgtransport.ErrOutcomeUnknown) || errors.Is(err, pgtransport.ErrLeaseLost) {
			e.t.Fatalf("%s, its reply lost after the commit: %v; want ErrOutcomeUnknown", what, err)
		}
		if lp.lost() != lp.armed {
			e.t.Fatalf("%s: the proxies lost %d replies, want %d", what, lp.lost(), lp.armed)
		}
	}
	gs := e.local("g-pub", "g-pm")
	gPub, gPM := gs[0], gs[1]

	// Publish and PublishMany: applied (publishing again would add copies).
	lp.cut(gPub, "pub-lost")
	_, err := tr.Publish(e.ctx(), gPub, "pub-lost", 0)
	unknown(err, "Publish")
	is.Equal(e.count(`SELECT count(*) FROM transport_messages WHERE event = 'pub-lost'`), 1) // committed
	lp.cut(gPM, "many-lost")
	_, err = tr.PublishMany(e.ctx(), []pgtransport.Message{{Group: gPM, Event: "many-lost"}, {Group: gPM, Event: "many-2"}})
	unknown(err, "PublishMany")
	is.Equal(e.count(`SELECT count(*) FROM transport_messages WHERE group_id = $1`, gPM), 2) // committed whole

	// Claim: a lease nobody holds; its group comes back after the visibility.
	lp.cut(gPub, "claimer-lost")
	l, err := tr.Claim(e.ctx(), "claimer-lost", time.Minute, 0)
	unknown(err, "Claim")
	is.Equal(l, nil)
	is.Equal(e.count(`SELECT count(*) FROM transport_groups WHERE locked_by LIKE 'claimer-lost:%'`), 1) // leased
	e.clock.Advance(2 * time.Minute)
	back, err := e.tr.ClaimMany(e.ctx(), "w", time.Minute, 0, 10)
	is.NoErr(err)
	is.Equal(len(back), 2) // the leased group came back, beside the other
	for _, b := range back {
		e.ack(b)
	}
	is.Equal(e.count(`SELECT count(*) FROM transport_messages WHERE group_id = $1`, gPM), 1)
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
	lp.cut("g-ack", "g-ack")
	unknown(tr.Ack(e.ctx(), leases["g-ack"]), "Ack")
	is.Equal(e.count(`SELECT count(*) FROM transport_messages WHERE group_id = 'g-ack'`), 0)

	// AckNext that keeps the group: asked again, it hands out the same
	// next message.
	lp.cut("g-next", "g-next")
	_, err = tr.AckNext(e.ctx(), leases["g-next"], time.Minute)
	unknown(err, "AckNext")
	next, err := tr.AckNext(e.ctx(), leases["g-next"], time.Minute)
	is.NoErr(err)                  // the retry of a keeping ack
	is.Equal(next.Event, "next-2") // the same next message

	// Nack: applied; the group is free.
	lp.cut("g-nack", "g-nack")
	unknown(tr.Nack(e.ctx(), leases["g-nack"], 0), "Nack")
	is.Equal(e.count(`SELECT count(*) FROM transport_groups WHERE group_id = 'g-nack' AND locked_by IS NULL`), 1)

	// Extend: applied; the lease holds ten minutes from now.
	lp.cut("g-ext", "g-ext")
	unknown(tr.Extend(e.ctx(), leases["g-ext"], 10*time.Minute), "Extend")
	now := float64(e.clock.Now().Unix())
	is.Equal(e.count(`SELECT count(*) FROM transport_groups WHERE group_id = 'g-ext' AND lock_expiry > $1::float8 + 300`, now), 1)

	// AckMany cut off by its ctx after its acks applied: the ctx ends
	// once the proxy holds the reply (a fixed deadline could end it
	// before the request reached the server, on a loaded machine). On
	// partitions g-many2's share, on another partition, may be answered.
	lp.hold("g-many1", "g-many1")
	ctx, cancel := context.WithCancel(e.ctx())
	defer cancel()
	held := make(chan struct{})
	go func() {
		defer close(held)
		for lp.lost() < lp.armed && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}()
	_, err = tr.AckMany(ctx, []*pgtransport.Lease{leases["g-many1"], leases["g-many2"]})
	cancel() // if AckMany returned before the proxy held its reply, the check below says so
	<-held
	unknown(err, "AckMany")
	is.True(errors.Is(err, context.Canceled)) // and ctx's error
	is.Equal(e.count(`SELECT count(*) FROM transport_messages WHERE group_id IN ('g-many1', 'g-many2')`), 0)
}
