package contract

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// ackCases: how a lease ends (ack, nack, a park, a lapse) and is fenced,
// one lease or a batch, a kept group's next message, and what the
// settling calls accept.
var ackCases = []testCase{
	{"NackZeroFreesGroupWithHeadUnchanged", nackZeroFreesGroupWithHeadUnchanged},
	{"NackWithDelayParksGroup", nackWithDelayParksGroup},
	{"LeaseExpiryHandsOverAndFencesOldHolder", leaseExpiryHandsOverAndFencesOldHolder},
	{"ExtendKeepsLeasePastVisibility", extendKeepsLeasePastVisibility},
	{"PriorityResetsAfterGroupDrains", priorityResetsAfterGroupDrains},
	{"AckKeepsGroupRowWhileMessagesRemain", ackKeepsGroupRowWhileMessagesRemain},
	{"AckManySettlesEachLeaseOnItsOwnFence", ackManySettlesEachLeaseOnItsOwnFence},
	{"AckManySettlesRepeatedLeaseOnce", ackManySettlesRepeatedLeaseOnce},
	{"AckNextKeepsHotGroupForMaxKeep", ackNextKeepsHotGroupForMaxKeep},
	{"KeepYieldsToAWaitingGroup", keepYieldsToAWaitingGroup},
	{"AckOfKeptLeasesEarlierMessageIsLost", ackOfKeptLeasesEarlierMessageIsLost},
	{"AckOfSeqNotHandedOutIsLost", ackOfSeqNotHandedOutIsLost},
	{"OverlappingPublishAck", overlappingPublishAck},
	{"SettlesGroupIDsFromBeforeTheRule", settlesGroupIDsFromBeforeTheRule},
}

// nackZeroFreesGroupWithHeadUnchanged: a nack(0) gives the group back
// first in line, with its head; a and b share a partition.
func nackZeroFreesGroupWithHeadUnchanged(is *is.I, e *env) {
	gs := e.local("a", "b")
	e.publish(gs[0], "a1", 0)
	e.publish(gs[0], "a2", 0)
	e.publish(gs[1], "b1", 0)
	l := e.claim("w", 0)
	is.Equal(l.Event, "a1")
	is.NoErr(e.tr.Nack(e.ctx(), l, 0)) // nack(0)
	again := e.claim("w", 0)
	is.Equal(again.Event, "a1") // the same head, first in line again
	is.True(again.Token != l.Token)
	is.True(errors.Is(e.tr.Ack(e.ctx(), l), pgtransport.ErrLeaseLost)) // the nacked lease is gone
}

func nackWithDelayParksGroup(is *is.I, e *env) {
	e.publish("a", "a1", 0)
	l := e.claim("w", 0)
	is.NoErr(e.tr.Nack(e.ctx(), l, 10*time.Second))
	is.Equal(e.claim("w", 0), nil) // parked
	e.clock.Advance(9 * time.Second)
	is.Equal(e.claim("w", 0), nil) // still parked
	e.clock.Advance(2 * time.Second)
	back := e.claim("w", 0)
	is.True(back != nil)
	is.Equal(back.Event, "a1") // the same head after the park
	e.ack(back)
	is.Equal(e.claim("w", 0), nil)
}

func leaseExpiryHandsOverAndFencesOldHolder(is *is.I, e *env) {
	e.publish("g", "m1", 0)
	e.publish("g", "m2", 0)
	old, err := e.tr.Claim(e.ctx(), "old", 10*time.Second, 0)
	is.NoErr(err)
	is.Equal(e.claim("other", 0), nil) // held
	e.clock.Advance(11 * time.Second)
	other := e.open()
	taken, err := other.Claim(e.ctx(), "new", time.Minute, 0)
	is.NoErr(err)
	is.True(taken != nil)
	is.Equal(taken.Event, "m1")                                                          // the unacked head is redelivered
	is.True(errors.Is(e.tr.Ack(e.ctx(), old), pgtransport.ErrLeaseLost))                 // ack
	is.True(errors.Is(e.tr.Nack(e.ctx(), old, 0), pgtransport.ErrLeaseLost))             // nack
	is.True(errors.Is(e.tr.Nack(e.ctx(), old, time.Second), pgtransport.ErrLeaseLost))   // park
	is.True(errors.Is(e.tr.Extend(e.ctx(), old, time.Minute), pgtransport.ErrLeaseLost)) // extend
	m, g := e.rows()
	is.Equal(m, 2) // the old holder deleted nothing
	is.Equal(g, 1)
	is.NoErr(other.Ack(e.ctx(), taken)) // the new holder still holds
	next := e.claim("new", 0)
	is.Equal(next.Event, "m2")
}

func extendKeepsLeasePastVisibility(is *is.I, e *env) {
	e.publish("g", "m1", 0)
	l, err := e.tr.Claim(e.ctx(), "w", 10*time.Second, 0)
	is.NoErr(err)
	e.clock.Advance(8 * time.Second)
	is.NoErr(e.tr.Extend(e.ctx(), l, 10*time.Second))
	e.clock.Advance(8 * time.Second)   // 16 s after the claim, 8 s after the extend
	is.Equal(e.claim("thief", 0), nil) // still held
	is.NoErr(e.tr.Ack(e.ctx(), l))
}

func priorityResetsAfterGroupDrains(is *is.I, e *env) {
	e.publish("g", "first", 4)
	e.ack(e.claim("w", 4))
	m, g := e.rows()
	is.Equal(m+g, 0) // drained: the group row is deleted
	e.publish("g", "second", 0)
	is.Equal(e.claim("w", 1), nil) // the new first publish set priority 0
	is.Equal(e.claim("w", 0).Event, "second")
}

func ackKeepsGroupRowWhileMessagesRemain(is *is.I, e *env) {
	e.publish("g", "1", 0)
	e.publish("g", "2", 0)
	e.ack(e.claim("w", 0))
	is.Equal(e.count(`SELECT count(*) FROM transport_groups WHERE group_id = 'g' AND locked_by IS NULL AND lock_expiry IS NOT NULL`), 1) // freed with lock_expiry = now
	e.ack(e.claim("w", 0))
	m, g := e.rows()
	is.Equal(m, 0)
	is.Equal(g, 0) // drained group row deleted
}

func ackManySettlesEachLeaseOnItsOwnFence(is *is.I, e *env) {
	e.publish("a", "a1", 0)
	e.publish("b", "b1", 0)
	ls, err := e.tr.ClaimMany(e.ctx(), "w1", 10*time.Second, 0, 2)
	is.NoErr(err)
	is.Equal(len(ls), 2)
	e.clock.Advance(11 * time.Second) // both lapse; w2 takes one
	stolen := e.claim("w2", 0)
	errs, err := e.tr.AckMany(e.ctx(), ls)
	is.NoErr(err)
	lost := 0
	for i, l := range ls {
		if l.Group == stolen.Group {
			is.True(errors.Is(errs[i], pgtransport.ErrLeaseLost)) // fenced off
			lost++
		} else {
			is.NoErr(errs[i]) // a lapsed lease nobody took still holds
		}
	}
	is.Equal(lost, 1)
	e.ack(stolen) // the thief's lease was untouched
	m, g := e.rows()
	is.Equal(m+g, 0)
}

// ackManySettlesRepeatedLeaseOnce: a lease named twice in a batch is
// settled once: the repeat is reported lost.
func ackManySettlesRepeatedLeaseOnce(is *is.I, e *env) {
	e.publish("a", "a1", 0)
	e.publish("a", "a2", 0)
	e.publish("b", "b1", 0)
	ls, err := e.tr.ClaimMany(e.ctx(), "w1", time.Minute, 0, 2)
	is.NoErr(err)
	is.Equal(len(ls), 2)
	a, b := ls[0], ls[1]
	if a.Group != "a" {
		a, b = b, a
	}
	errs, err := e.tr.AckMany(e.ctx(), []*pgtransport.Lease{a, b, a, a})
	is.NoErr(err)
	is.Equal(len(errs), 4)
	is.NoErr(errs[0]) // the first naming of a settles it
	is.NoErr(errs[1])
	is.True(errors.Is(errs[2], pgtransport.ErrLeaseLost)) // the repeats settle nothing
	is.True(errors.Is(errs[3], pgtransport.ErrLeaseLost))
	m, _ := e.rows()
	is.Equal(m, 1) // a1 and b1 acked, a2 left: one message deleted per lease
	next := e.claim("w2", 0)
	is.Equal(next.Event, "a2")
	e.ack(next)
}

// ackNextKeepsHotGroupForMaxKeep: AckNext keeps a hot group for MaxKeep
// messages, then serves the others. cold is served first (never-served
// groups in the order they arrived): the two share a partition.
func ackNextKeepsHotGroupForMaxKeep(is *is.I, e *env) {
	gs := e.local("cold", "hot")
	cold, hot := gs[0], gs[1]
	e.publish(cold, "c", 0)
	for i := range pgtransport.DefaultMaxKeep + 4 {
		e.publish(hot, event("hot", i), 0)
	}
	l := e.claim("w", 0)
	is.Equal(l.Group, cold) // never-served groups in the order they arrived
	e.ack(l)
	l = e.claim("w", 0)
	is.Equal(l.Event, event("hot", 0))
	taken := 1
	for {
		next, err := e.tr.AckNext(e.ctx(), l, time.Minute)
		is.NoErr(err)
		if next == nil {
			break
		}
		is.Equal(next.Token, l.Token)             // the same lease, kept
		is.Equal(next.Event, event("hot", taken)) // the group's next message, in order
		is.Equal(next.Kept, taken)
		l = next
		taken++
	}
	is.Equal(taken, pgtransport.DefaultMaxKeep) // then the group goes back to the round-robin
	is.Equal(e.claim("w2", 0).Event, event("hot", taken))
}

// keepYieldsToAWaitingGroup: while another group waits to be claimed,
// AckNext keeps a group for Config.KeepWhileWaiting messages in a row
// (the default here), then yields: the message is acked, the group freed,
// the waiting group served next and the hot group after it. The two share
// a partition.
func keepYieldsToAWaitingGroup(is *is.I, e *env) {
	gs := e.local("hot", "late")
	hot, late := gs[0], gs[1]
	for i := range pgtransport.DefaultKeepWhileWaiting + 1 {
		e.publish(hot, event("hot", i), 0)
	}
	l := e.claim("w", 0)
	is.Equal(l.Event, event("hot", 0))
	e.publish(late, "late", 0) // waits from now on
	taken := 1
	for {
		next, err := e.tr.AckNext(e.ctx(), l, time.Minute)
		is.NoErr(err)
		if next == nil {
			break
		}
		is.Equal(next.Event, event("hot", taken)) // kept, in order
		l = next
		taken++
	}
	is.Equal(taken, pgtransport.DefaultKeepWhileWaiting)                                     // then the keep yields
	is.Equal(e.count(`SELECT count(*) FROM transport_messages WHERE group_id = $1`, hot), 1) // its last message acked
	is.Equal(e.claim("w", 0).Group, late)                                                    // the waiting group first
	is.Equal(e.claim("w", 0).Event, event("hot", taken))                                     // then the hot group's next message
}

// ackOfKeptLeasesEarlierMessageIsLost: an ack of a kept lease's earlier
// message is lost and leaves the group held.
func ackOfKeptLeasesEarlierMessageIsLost(is *is.I, e *env) {
	e.publish("g", "e1", 0)
	e.publish("g", "e2", 0)
	first := e.claim("w", 0)
	next, err := e.tr.AckNext(e.ctx(), first, time.Minute)
	is.NoErr(err)
	is.Equal(next.Event, "e2")
	is.Equal(next.Token, first.Token) // one token for both messages
	is.True(errors.Is(e.tr.Ack(e.ctx(), first), pgtransport.ErrLeaseLost))
	errs, err := e.tr.AckMany(e.ctx(), []*pgtransport.Lease{first}) // in a batch too
	is.NoErr(err)
	is.True(errors.Is(errs[0], pgtransport.ErrLeaseLost))
	none, err := e.tr.Claim(e.ctx(), "w2", time.Minute, 0)
	is.NoErr(err)
	is.True(none == nil) // still held for e2
	e.ack(next)
	m, g := e.rows()
	is.Equal(m+g, 0)
}

// ackOfSeqNotHandedOutIsLost: under a valid token, a settling call that
// names a seq its claim did not hand out is ErrLeaseLost and changes
// nothing.
func ackOfSeqNotHandedOutIsLost(is *is.I, e *env) {
	e.publish("g", "m1", 0)
	s2, err := e.tr.Publish(e.ctx(), "g", "m2", 0)
	is.NoErr(err)
	l := e.claim("w", 0)
	is.Equal(l.Event, "m1")
	forged := *l
	forged.Seq, forged.Event = s2, "m2"
	before := e.snapshot()
	is.True(errors.Is(e.tr.Ack(e.ctx(), &forged), pgtransport.ErrLeaseLost)) // Ack
	errs, err := e.tr.AckMany(e.ctx(), []*pgtransport.Lease{&forged})
	is.NoErr(err)
	is.True(errors.Is(errs[0], pgtransport.ErrLeaseLost)) // AckMany
	_, err = e.tr.AckNext(e.ctx(), &forged, time.Minute)
	is.True(errors.Is(err, pgtransport.ErrLeaseLost))                                          // AckNext
	is.True(errors.Is(e.tr.Fail(e.ctx(), &forged, errors.New("x")), pgtransport.ErrLeaseLost)) // Fail
	is.Equal(e.snapshot(), before)                                                             // nothing changed
	e.ack(l)
	is.Equal(e.claim("w", 0).Event, "m2")
}

// overlappingPublishAck: two publishes to one group that overlap have no
// order but their commits': a claim hands out the higher seq while the
// lower is uncommitted, and the ack of what it handed out is accepted:
// the server records which message a claim handed out (since schema
// version 10), so this ack passes where one of a message behind the head
// under the same token is refused. The lower seq comes next.
func overlappingPublishAck(is *is.I, e *env) {
	e.publish("g", "m0", 0)
	first := e.claim("w", 0) // m0: the group row exists from here on
	tx := e.begin("g")
	_, err := tx.Exec(e.ctx(), `SELECT harel_publish('g', 'm1', 0)`)
	is.NoErr(err) // m1: the lower seq, not yet committed
	e.publish("g", "m2", 0)
	e.ack(first)
	l := e.claim("w", 0)
	is.Equal(l.Event, "m2") // m1 is not there yet
	is.NoErr(tx.Commit(e.ctx()))
	is.NoErr(e.tr.Ack(e.ctx(), l)) // m2 was handed out: its ack holds
	is.Equal(e.claim("w", 0).Event, "m1")
}

// settlesGroupIDsFromBeforeTheRule: a database of version 8 (no group-id
// rule in the schema) holds messages of groups whose ids the Go client
// refuses to publish (empty, longer than MaxGroupBytes). Upgraded by
// opening a transport, it delivers them, and every settling call works on
// their leases: the client never refuses to settle a lease the database
// issued. Until version 9 each of them returned ErrInvalidGroup, and the
// group stayed blocked.
func settlesGroupIDsFromBeforeTheRule(is *is.I, e *env) {
	e.skipOnPartitions("a partition is numbered empty (harel_partition refuses a database holding messages), " +
		"after version 9 gave every new message a valid group id: no partition holds a message of version 8")
	db := pgtest.New(e.t, 4)
	_, here, _, _ := runtime.Caller(0)
	v8, err := os.ReadFile(filepath.Join(filepath.Dir(here), "..", "..", "..", "testdata", "schema", "v8.sql"))
	is.NoErr(err)
	_, err = db.Pool.Exec(e.ctx(), string(v8))
	is.NoErr(err) // a database at version 8
	long := strings.Repeat("L", 2*pgtransport.MaxGroupBytes)
	for _, q := range []string{
		`INSERT INTO transport_messages (group_id, event) VALUES ('', 'x')`, // as a client of version 8 could
		`INSERT INTO transport_groups (group_id) VALUES ('')`,
		`INSERT INTO transport_messages (group_id, event) VALUES ('', 'y')`,
		`INSERT INTO transport_messages (group_id, event) VALUES ('` + long + `', 'z')`,
		`INSERT INTO transport_groups (group_id) VALUES ('` + long + `')`,
	} {
		_, err := db.Pool.Exec(e.ctx(), q)
		is.NoErr(err)
	}
	tr := e.must(e.openDB(e.t, db.Pool, pgtransport.Config{Schema: db.Schema, Clock: e.clock.Now})) // applies version 9 over them

	l, err := tr.Claim(e.ctx(), "w", time.Minute, 0)
	is.NoErr(err)
	is.Equal(l.Group+"/"+l.Event, "/x")          // delivered
	is.NoErr(tr.Extend(e.ctx(), l, time.Minute)) // extended
	is.NoErr(tr.Nack(e.ctx(), l, 0))             // given back
	ls, err := tr.ClaimMany(e.ctx(), "w", time.Minute, 0, 2)
	is.NoErr(err)
	is.Equal(len(ls), 2) // both groups
	l, lo := ls[0], ls[1]
	if l.Group != "" {
		l, lo = lo, l
	}
	is.Equal(l.Group+"/"+l.Event, "/x")
	is.Equal(lo.Group, long)
	errs, err := tr.AckMany(e.ctx(), []*pgtransport.Lease{lo})
	is.NoErr(err)
	is.NoErr(errs[0]) // acked in a batch
	next, err := tr.AckNext(e.ctx(), l, time.Minute)
	is.NoErr(err) // acked, the group kept (no other waits)
	is.Equal(next.Event, "y")
	is.NoErr(tr.Ack(e.ctx(), next)) // acked, the group drained

	_, err = tr.Publish(e.ctx(), "", "new", 0)
	is.True(errors.Is(err, pgtransport.ErrInvalidGroup)) // publishing such a group is still refused
	var n int
	is.NoErr(db.Pool.QueryRow(e.ctx(), `SELECT (SELECT count(*) FROM transport_messages) + (SELECT count(*) FROM transport_groups WHERE drained_at IS NULL)`).Scan(&n))
	is.Equal(n, 0) // all delivered, nothing left behind

	nul := *lo
	nul.Group = "a\x00b"                                                // no PostgreSQL text holds a NUL
	is.True(errors.Is(tr.Ack(e.ctx(), &nul), pgtransport.ErrLeaseLost)) // a lease that cannot exist
}
