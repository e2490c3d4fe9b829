// Package contract is the behaviour every transport front-end must show, as
// a table of cases over real PostgreSQL. Package sync runs it against the
// blocking Transport; package async runs the same cases against its twin.
package contract

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/internal/core"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
)

// Transport is the blocking form of the API under test.
type Transport interface {
	Publish(ctx context.Context, group, event string, priority int) (int64, error)
	Claim(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error)
	Ack(ctx context.Context, lease *pgtransport.Lease) error
	Nack(ctx context.Context, lease *pgtransport.Lease, delay time.Duration) error
	Extend(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) error
	PublishMany(ctx context.Context, msgs []pgtransport.Message) ([]int64, error)
	ClaimMany(ctx context.Context, workerID string, visibility time.Duration, minPriority, max int) ([]*pgtransport.Lease, error)
	AckMany(ctx context.Context, leases []*pgtransport.Lease) ([]error, error)
	AckNext(ctx context.Context, lease *pgtransport.Lease, visibility time.Duration) (*pgtransport.Lease, error)
	ClaimWait(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error)
	Fail(ctx context.Context, lease *pgtransport.Lease, cause error) error
	PublishMessage(ctx context.Context, msg pgtransport.Message) (int64, error)
	PublishMessageTx(ctx context.Context, tx pgx.Tx, msg pgtransport.Message) (int64, error)
	DeadLetters(ctx context.Context, q pgtransport.DeadLetterQuery) ([]pgtransport.DeadLetter, error)
	Redrive(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error)
	PurgeDeadLetters(ctx context.Context, f pgtransport.DeadLetterFilter) (int64, error)
	RestartGroup(ctx context.Context, group string, skipHead bool) error
	SetPolicy(ctx context.Context, p pgtransport.Policy) error
	Policy(ctx context.Context) (pgtransport.Policy, error)
}

// Open returns the transport under test on db with cfg, or the error its
// constructor returned; the test owns it (register any Close with
// t.Cleanup).
type Open func(t *testing.T, db core.DBTX, cfg pgtransport.Config) (Transport, error)

// Clock is a settable clock for Config.Clock.
type Clock struct {
	mu  stdsync.Mutex
	now time.Time
}

// NewClock returns a clock stopped at a fixed instant.
func NewClock() *Clock { return &Clock{now: time.Unix(1_800_000_000, 0)} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// env is what a case gets: a transport on a fresh schema, its clock and the
// schema's pool for looking at the tables.
type env struct {
	t     *testing.T
	tr    Transport
	clock *Clock
	db    *pgtest.DB
	open  func() Transport // another transport on the same schema and clock
	// openOn opens another transport on the same schema and clock, on
	// pool (one through a pgtest.Proxy, say).
	openOn func(pool *pgxpool.Pool) Transport
	// openDB opens a transport on another test database (its schema
	// loaded as the case needs), with the same clock.
	openDB func(db *pgtest.DB) Transport
	// openCfg opens another transport on the same schema with cfg
	// (its Schema and Clock set to the case's), or returns the error
	// its constructor returned.
	openCfg func(cfg pgtransport.Config) (Transport, error)
}

func (e *env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	e.t.Cleanup(cancel)
	return ctx
}

func (e *env) publish(group, event string, priority int) {
	e.t.Helper()
	if _, err := e.tr.Publish(e.ctx(), group, event, priority); err != nil {
		e.t.Fatalf("publish %s/%s: %v", group, event, err)
	}
}

func (e *env) claim(worker string, minPriority int) *pgtransport.Lease {
	e.t.Helper()
	l, err := e.tr.Claim(e.ctx(), worker, time.Minute, minPriority)
	if err != nil {
		e.t.Fatalf("claim: %v", err)
	}
	return l
}

func (e *env) ack(l *pgtransport.Lease) {
	e.t.Helper()
	if l == nil {
		e.t.Fatal("ack: no lease")
	}
	if err := e.tr.Ack(e.ctx(), l); err != nil {
		e.t.Fatalf("ack %s/%d: %v", l.Group, l.Seq, err)
	}
}

// count runs a count(*) query over the test's schema.
func (e *env) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.db.Pool.QueryRow(e.ctx(), query, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	return n
}

func (e *env) rows() (messages, groups int) {
	return e.count(`SELECT count(*) FROM transport_messages`), e.count(`SELECT count(*) FROM transport_groups`)
}

// testCase is one behaviour. Its name is CamelCase, without spaces, colons
// or slashes, so that -run selects it as written:
// go test -run 'Contract/FIFOWithinAGroup' ./sync/ ./async/.
type testCase struct {
	name string
	run  func(is *is.I, e *env)
}

// Run runs every case against transports from open, each in its own schema.
func Run(t *testing.T, open Open) {
	for _, tc := range cases {
		if strings.ContainsAny(tc.name, " :/") {
			t.Errorf("case %q: a name -run cannot select as written", tc.name)
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			db := pgtest.New(t, 24)
			clock := NewClock()
			cfg := pgtransport.Config{Schema: db.Schema, Clock: clock.Now}
			e := &env{t: t, clock: clock, db: db}
			must := func(tr Transport, err error) Transport {
				t.Helper()
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				return tr
			}
			e.open = func() Transport { return must(open(t, db.Pool, cfg)) }
			e.openOn = func(pool *pgxpool.Pool) Transport { return must(open(t, pool, cfg)) }
			e.openDB = func(other *pgtest.DB) Transport {
				return must(open(t, other.Pool, pgtransport.Config{Schema: other.Schema, Clock: clock.Now}))
			}
			e.openCfg = func(c pgtransport.Config) (Transport, error) {
				c.Schema, c.Clock = db.Schema, clock.Now
				return open(t, db.Pool, c)
			}
			e.tr = e.open()
			tc.run(is, e)
		})
	}
}

func event(group string, i int) string { return fmt.Sprintf("%s-%d", group, i) }

var cases = []testCase{
	{"FIFOWithinAGroup", func(is *is.I, e *env) {
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
	}},

	{"OneLeasePerGroup", func(is *is.I, e *env) {
		e.publish("G", "g1", 0)
		e.publish("G", "g2", 0)
		e.publish("H", "h1", 0)
		g := e.claim("w1", 0)
		is.Equal(g.Group, "G") // never-served groups in group id order
		h := e.claim("w2", 0)
		is.Equal(h.Group, "H")          // while G is leased, H is served
		is.Equal(e.claim("w3", 0), nil) // then nothing: G's second message waits for G's lease
		e.ack(g)
		next := e.claim("w3", 0)
		is.True(next != nil)           // ack freed G
		is.Equal(next.Event, "g2")     // with its next message
		is.True(next.Token != g.Token) // under a new token
	}},

	{"PublishKeepsLiveLeaseAndFirstPriority", func(is *is.I, e *env) {
		e.publish("g", "a", 3)
		l := e.claim("w", 0)
		e.publish("g", "b", 0)
		is.Equal(e.claim("w2", 0), nil)                                                    // the publish did not free the leased group
		is.Equal(e.count(`SELECT priority FROM transport_groups WHERE group_id = 'g'`), 3) // nor reset its priority
		e.ack(l)
		next := e.claim("w2", 3)
		is.Equal(next.Event, "b") // still at priority 3
	}},

	{"NackZeroFreesGroupWithHeadUnchanged", func(is *is.I, e *env) {
		e.publish("a", "a1", 0)
		e.publish("a", "a2", 0)
		e.publish("b", "b1", 0)
		l := e.claim("w", 0)
		is.Equal(l.Event, "a1")
		is.NoErr(e.tr.Nack(e.ctx(), l, 0)) // nack(0)
		again := e.claim("w", 0)
		is.Equal(again.Event, "a1") // the same head, first in line again
		is.True(again.Token != l.Token)
		is.True(errors.Is(e.tr.Ack(e.ctx(), l), pgtransport.ErrLeaseLost)) // the nacked lease is gone
	}},

	{"NackWithDelayParksGroup", func(is *is.I, e *env) {
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
	}},

	{"LeaseExpiryHandsOverAndFencesOldHolder", func(is *is.I, e *env) {
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
	}},

	{"ExtendKeepsLeasePastVisibility", func(is *is.I, e *env) {
		e.publish("g", "m1", 0)
		l, err := e.tr.Claim(e.ctx(), "w", 10*time.Second, 0)
		is.NoErr(err)
		e.clock.Advance(8 * time.Second)
		is.NoErr(e.tr.Extend(e.ctx(), l, 10*time.Second))
		e.clock.Advance(8 * time.Second)   // 16 s after the claim, 8 s after the extend
		is.Equal(e.claim("thief", 0), nil) // still held
		is.NoErr(e.tr.Ack(e.ctx(), l))
	}},

	{"RoundRobinServesNeverServedGroupFirst", func(is *is.I, e *env) {
		e.publish("a", "a1", 0)
		e.publish("a", "a2", 0)
		e.publish("b", "b1", 0)
		first := e.claim("w", 0)
		is.Equal(first.Group, "a")
		e.clock.Advance(time.Millisecond)
		e.ack(first)
		e.clock.Advance(time.Millisecond)
		e.publish("c", "c1", 0)
		is.Equal(e.claim("w", 0).Group, "b") // b and c were never served: they come before a
	}},

	{"NeverServedGroupsInArrivalOrder", func(is *is.I, e *env) {
		e.publish("z", "z1", 0)
		e.publish("a", "a1", 0)
		e.publish("m", "m1", 0)
		is.Equal(e.claim("w", 0).Group, "z") // first come, first served (until version 12: by group id)
		l := e.claim("w", 0)
		is.Equal(l.Group, "a")
		is.NoErr(e.tr.Nack(e.ctx(), l, 0))   // given back with no delay:
		is.Equal(e.claim("w", 0).Group, "a") // first in line again, before m
		is.Equal(e.claim("w", 0).Group, "m")
	}},

	// A lease that ended waits its turn among the free groups by its end
	// (free rows and held rows have an index each since version 12; the
	// claim merges them by key), one lease at a time or in a batch.
	{"EndedLeaseKeepsItsPlaceInRoundRobin", func(is *is.I, e *env) {
		for _, g := range []string{"early", "lapsed", "late", "last"} {
			e.publish(g, g+"1", 0)
			e.publish(g, g+"2", 0)
		}
		settle := func(group string) {
			l := e.claim("w", 0)
			is.Equal(l.Group, group)
			e.clock.Advance(time.Second)
			e.ack(l) // freed, its key the clock's now
		}
		settle("early") // key t+1
		lapsed := e.claim("w", 0)
		is.Equal(lapsed.Group, "lapsed")
		is.NoErr(e.tr.Extend(e.ctx(), lapsed, 1500*time.Millisecond)) // ends at t+2.5
		settle("late")                                                // key t+2
		settle("last")                                                // key t+3
		e.clock.Advance(time.Second)                                  // t+4: early, lapsed (ended), late, last
		batch, err := e.tr.ClaimMany(e.ctx(), "w", time.Minute, 0, 2)
		is.NoErr(err)
		got := map[string]bool{}
		for _, l := range batch {
			got[l.Group] = true
		}
		is.Equal(got, map[string]bool{"early": true, "late": true}) // t+1 and t+2 before t+2.5
		is.Equal(e.claim("w", 0).Group, "lapsed")                   // then the ended lease, before t+3
		is.Equal(e.claim("w", 0).Group, "last")
	}},

	// The claim's floors are hints (see "The floor" in schema/sql/functions/30_claim.sql): set
	// far past every row, a claim still finds each kind of claimable row.
	{"ClaimFindsRowsBelowItsFloors", func(is *is.I, e *env) {
		e.publish("free", "f1", 0)
		e.publish("free", "f2", 0)
		e.publish("lapsed", "l1", 0)
		e.publish("new", "n1", 0)
		served := e.claim("w", 0)
		is.Equal(served.Group, "free")
		e.ack(served) // free, served once
		lapsed, err := e.tr.Claim(e.ctx(), "w", pgtransport.MinVisibility, 0)
		is.NoErr(err)
		is.Equal(lapsed.Group, "lapsed")
		e.clock.Advance(2 * pgtransport.MinVisibility) // its lease has ended
		// Far past every row, and a walk from the front 1 ms ago (so none is due).
		_, err = e.db.Pool.Exec(e.ctx(), `SELECT setval('transport_claim_new', 1e15::bigint), setval('transport_claim_floor', 1e15::bigint),
			setval('transport_claim_held', 1e15::bigint), setval('transport_claim_sweep', $1)`, e.clock.Now().UnixMilli()-1)
		is.NoErr(err)
		got := map[string]bool{}
		for range 3 {
			l := e.claim("w", 0)
			is.True(l != nil) // never empty while anything is claimable
			got[l.Group] = true
		}
		is.Equal(got, map[string]bool{"free": true, "lapsed": true, "new": true})
		is.Equal(e.claim("w", 0), nil)
	}},

	{"RoundRobinRotatesThroughManyGroups", func(is *is.I, e *env) {
		const groups, per = 12, 3
		for m := range per {
			for g := range groups {
				e.publish(fmt.Sprintf("g%02d", g), event("m", m), 0)
			}
		}
		for i := range groups * per {
			e.clock.Advance(time.Millisecond)
			l := e.claim("w", 0)
			is.Equal(l.Group, fmt.Sprintf("g%02d", i%groups)) // every group once per pass, same order each pass
			is.Equal(l.Event, event("m", i/groups))           // and each group in FIFO order
			e.ack(l)
		}
	}},

	{"PriorityFloor", func(is *is.I, e *env) {
		e.publish("low", "l1", 0)
		e.publish("mid", "m1", 2)
		e.publish("high", "h1", 4)
		is.Equal(e.claim("w", 3).Group, "high")
		is.Equal(e.claim("w", 3), nil)         // nothing else at 3 or above
		is.Equal(e.claim("w", 1).Group, "mid") // floor 1 admits mid
		is.Equal(e.claim("w", 0).Group, "low") // floor 0 admits all
	}},

	{"PriorityResetsAfterGroupDrains", func(is *is.I, e *env) {
		e.publish("g", "first", 4)
		e.ack(e.claim("w", 4))
		m, g := e.rows()
		is.Equal(m+g, 0) // drained: the group row is deleted
		e.publish("g", "second", 0)
		is.Equal(e.claim("w", 1), nil) // the new first publish set priority 0
		is.Equal(e.claim("w", 0).Event, "second")
	}},

	{"AckKeepsGroupRowWhileMessagesRemain", func(is *is.I, e *env) {
		e.publish("g", "1", 0)
		e.publish("g", "2", 0)
		e.ack(e.claim("w", 0))
		is.Equal(e.count(`SELECT count(*) FROM transport_groups WHERE group_id = 'g' AND locked_by IS NULL AND lock_expiry IS NOT NULL`), 1) // freed with lock_expiry = now
		e.ack(e.claim("w", 0))
		m, g := e.rows()
		is.Equal(m, 0)
		is.Equal(g, 0) // drained group row deleted
	}},

	{"ClaimCleansUpStaleEmptyGroupRow", func(is *is.I, e *env) {
		_, err := e.db.Pool.Exec(e.ctx(), `INSERT INTO transport_groups (group_id) VALUES ('aaa-stale')`)
		is.NoErr(err)
		e.publish("zzz", "z1", 0)
		l := e.claim("w", 0)
		is.Equal(l.Group, "zzz")                                                                   // the stale row (sorted first) was skipped
		is.Equal(e.count(`SELECT count(*) FROM transport_groups WHERE group_id = 'aaa-stale'`), 0) // and deleted
	}},

	{"BadInputIsRefusedAndWritesNothing", func(is *is.I, e *env) {
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
	}},

	// Lost-publish race: publish during a draining ack never strands a message.
	{"LostPublishRace", func(is *is.I, e *env) {
		is.NoErr(raceRounds(e, 2000, e.tr.Ack))                                                                                                             // every round delivered the racing publish
		is.Equal(e.count(`SELECT count(*) FROM transport_messages m WHERE NOT EXISTS (SELECT 1 FROM transport_groups g WHERE g.group_id = m.group_id)`), 0) // no message without a group row
		m, g := e.rows()
		is.Equal(m+g, 0)
	}},

	// Batch publish keeps order within groups and each group's first priority.
	{"BatchPublishKeepsOrderAndFirstPriority", func(is *is.I, e *env) {
		seqs, err := e.tr.PublishMany(e.ctx(), []pgtransport.Message{
			{Group: "a", Event: "a0", Priority: 2}, {Group: "b", Event: "b0"}, {Group: "a", Event: "a1", Priority: 4}, {Group: "a", Event: "a2"},
		})
		is.NoErr(err)
		is.Equal(len(seqs), 4)
		for i := 1; i < len(seqs); i++ {
			is.True(seqs[i] > seqs[i-1]) // seqs in slice order
		}
		is.Equal(e.count(`SELECT priority FROM transport_groups WHERE group_id = 'a'`), 2) // a's first message set it
		for _, want := range []string{"a0", "a1", "a2"} {
			l := e.claim("w", 2)
			is.Equal(l.Event, want) // FIFO within a
			e.ack(l)
		}
	}},

	// Claim many leases distinct groups, each to one holder.
	{"ClaimManyLeasesDistinctGroups", func(is *is.I, e *env) {
		for g := range 5 {
			e.publish(fmt.Sprint("g", g), "first", 0)
			e.publish(fmt.Sprint("g", g), "second", 0)
		}
		first, err := e.tr.ClaimMany(e.ctx(), "w1", time.Minute, 0, 3)
		is.NoErr(err)
		is.Equal(len(first), 3)
		rest, err := e.tr.ClaimMany(e.ctx(), "w2", time.Minute, 0, 10)
		is.NoErr(err)
		is.Equal(len(rest), 2) // only the groups w1 does not hold
		seen := map[string]bool{}
		for _, l := range append(first, rest...) {
			is.True(!seen[l.Group]) // no group twice
			seen[l.Group] = true
			is.Equal(l.Event, "first") // each group's head
		}
		none, err := e.tr.ClaimMany(e.ctx(), "w3", time.Minute, 0, 10)
		is.NoErr(err)
		is.Equal(len(none), 0)
		errs, err := e.tr.AckMany(e.ctx(), first)
		is.NoErr(err)
		is.Equal(errs, []error{nil, nil, nil})
		again, err := e.tr.ClaimMany(e.ctx(), "w3", time.Minute, 0, 10)
		is.NoErr(err)
		is.Equal(len(again), 3)
		for _, l := range again {
			is.Equal(l.Event, "second") // acked heads are gone, the next ones follow
		}
	}},

	{"AckManySettlesEachLeaseOnItsOwnFence", func(is *is.I, e *env) {
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
	}},

	// Ack many settles a lease named twice once: the repeat is reported lost.
	{"AckManySettlesRepeatedLeaseOnce", func(is *is.I, e *env) {
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
	}},

	// Ack next keeps a hot group for MaxKeep messages, then serves the others.
	{"AckNextKeepsHotGroupForMaxKeep", func(is *is.I, e *env) {
		e.publish("cold", "c", 0)
		for i := range pgtransport.DefaultMaxKeep + 4 {
			e.publish("hot", event("hot", i), 0)
		}
		l := e.claim("w", 0)
		is.Equal(l.Group, "cold") // never-served groups in the order they arrived
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
	}},

	// An ack of a kept lease's earlier message is lost and leaves the group held.
	{"AckOfKeptLeasesEarlierMessageIsLost", func(is *is.I, e *env) {
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
	}},

	{"ClaimWaitParksUntilWorkOrCtxEnds", func(is *is.I, e *env) {
		got := make(chan *pgtransport.Lease, 1)
		go func() {
			l, err := e.tr.ClaimWait(e.ctx(), "w", time.Minute, 0)
			if err != nil {
				e.t.Error(err)
			}
			got <- l
		}()
		e.db.WaitParked(e.t)
		e.publish("g", "e", 0)
		select {
		case l := <-got:
			is.Equal(l.Event, "e")
		case <-time.After(30 * time.Second):
			e.t.Fatal("ClaimWait never woke")
		}
		ctx, cancel := context.WithTimeout(e.ctx(), 100*time.Millisecond)
		defer cancel()
		l, err := e.tr.ClaimWait(ctx, "w", time.Minute, 0)
		is.True(l == nil)
		is.True(errors.Is(err, context.DeadlineExceeded)) // ctx's end, not a nil lease
	}},

	{"BatchBadInputWritesNothing", func(is *is.I, e *env) {
		_, err := e.tr.PublishMany(e.ctx(), nil)
		is.True(errors.Is(err, pgtransport.ErrInvalidBatch))
		_, err = e.tr.PublishMany(e.ctx(), []pgtransport.Message{{Group: "ok", Event: "1"}, {Group: "", Event: "2"}})
		is.True(errors.Is(err, pgtransport.ErrInvalidGroup))
		_, err = e.tr.PublishMany(e.ctx(), []pgtransport.Message{{Group: "ok", Event: "1"}, {Group: "ok", Event: "2", Priority: 9}})
		is.True(errors.Is(err, pgtransport.ErrInvalidPriority))
		_, err = e.tr.PublishMany(e.ctx(), make([]pgtransport.Message, pgtransport.MaxBatch+1))
		is.True(errors.Is(err, pgtransport.ErrInvalidGroup)) // a batch past MaxBatch is checked whole too
		_, err = e.tr.ClaimMany(e.ctx(), "w", time.Minute, 0, 0)
		is.True(errors.Is(err, pgtransport.ErrInvalidBatch))
		_, err = e.tr.ClaimMany(e.ctx(), "", time.Minute, 0, 1)
		is.True(errors.Is(err, pgtransport.ErrInvalidWorkerID))
		_, err = e.tr.AckMany(e.ctx(), []*pgtransport.Lease{nil})
		is.True(errors.Is(err, pgtransport.ErrNilLease))
		_, err = e.tr.AckMany(e.ctx(), nil)
		is.True(errors.Is(err, pgtransport.ErrInvalidBatch))
		_, err = e.tr.AckNext(e.ctx(), nil, time.Minute)
		is.True(errors.Is(err, pgtransport.ErrNilLease))
		m, g := e.rows()
		is.Equal(m+g, 0) // nothing written
	}},

	// Lost-publish race, batch ack: publish during a draining AckMany never strands a message.
	{"LostPublishRaceBatchAck", func(is *is.I, e *env) {
		is.NoErr(raceRounds(e, 1000, func(ctx context.Context, l *pgtransport.Lease) error {
			errs, err := e.tr.AckMany(ctx, []*pgtransport.Lease{l})
			if err != nil {
				return err
			}
			return errs[0]
		}))
		m, g := e.rows()
		is.Equal(m+g, 0)
	}},

	// Stress: every message once acked, per-group order, one holder per group.
	{"Stress", func(is *is.I, e *env) {
		const workers, groups, per = 8, 40, 15
		for m := range per {
			for g := range groups {
				e.publish(fmt.Sprintf("g%d", g), event("m", m), 0)
			}
		}
		var (
			mu     stdsync.Mutex
			holder = map[string]string{}
			next   = map[string]int{}
			acked  int
			errs   = make(chan error, workers)
			wg     stdsync.WaitGroup
		)
		for w := range workers {
			tr := e.open()
			wg.Go(func() {
				errs <- func() error {
					id := fmt.Sprintf("w%d", w)
					for {
						l, err := tr.Claim(e.ctx(), id, time.Minute, 0)
						if err != nil {
							return err
						}
						if l == nil {
							return nil
						}
						mu.Lock()
						if h := holder[l.Group]; h != "" {
							mu.Unlock()
							return fmt.Errorf("group %s held by %s and %s at once", l.Group, h, id)
						}
						holder[l.Group] = id
						if want := event("m", next[l.Group]); l.Event != want {
							mu.Unlock()
							return fmt.Errorf("group %s: got %s, want %s", l.Group, l.Event, want)
						}
						next[l.Group]++
						mu.Unlock()
						runtime.Gosched() // the handler; another worker's claim lands here if exclusion is broken
						// Released just before the ack is sent: [claim returned, ack sent]
						// lies inside the server-side lease, so overlap here is a real double holder.
						mu.Lock()
						delete(holder, l.Group)
						mu.Unlock()
						if err := tr.Ack(e.ctx(), l); err != nil {
							return err
						}
						mu.Lock()
						acked++
						mu.Unlock()
					}
				}()
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			is.NoErr(err)
		}
		is.Equal(acked, groups*per) // every message delivered and acked exactly once
		for g := range groups {
			is.Equal(next[fmt.Sprintf("g%d", g)], per)
		}
		m, g := e.rows()
		is.Equal(m+g, 0)
	}},
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
			var dump []string
			rows, _ := e.db.Pool.Query(ctx, `SELECT 'm:'||seq||':'||group_id||':'||event FROM transport_messages UNION ALL SELECT 'g:'||group_id||':'||coalesce(locked_by,'-')||':'||coalesce(lock_expiry::text,'-') FROM transport_groups`)
			for rows.Next() {
				var s string
				_ = rows.Scan(&s)
				dump = append(dump, s)
			}
			rows.Close()
			return fmt.Errorf("round %d: m2 was stranded: no claimable group; tables: %v; lease %+v", r, dump, l)
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
