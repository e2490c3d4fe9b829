package pgtransport

import (
	"errors"
	"time"
)

// What an operator sees and steers (schema version 11): Stats, the groups
// and their heads, pause, resume and purge. Each call is one round-trip;
// the SQL functions behind them (harel_stats, harel_groups, harel_group,
// harel_peek, harel_pause_group, harel_resume_group, harel_purge_group)
// are part of the protocol, described in docs/protocol.md.

// DefaultGroupLimit is GroupQuery.Limit's zero value: the page size.
const DefaultGroupLimit = 100

// ErrUnknownGroup: the group has no row in the queue: it was never
// published to, or it drained (a group's row goes with its last message,
// unless the group is paused). Nothing changed.
var ErrUnknownGroup = errors.New("pgtransport: unknown group")

// ErrInvalidQuery: a GroupQuery with an unknown State or Order, or a
// negative Offset or Limit. Nothing was read.
var ErrInvalidQuery = errors.New("pgtransport: invalid query")

// GroupState is what a group is doing, by the database server's clock.
// The states do not overlap: a paused group is GroupPaused whatever else
// holds (a holder may still be finishing its message).
type GroupState string

const (
	// GroupFree: claimable now (never claimed, freed by an ack, a lapsed
	// lease, or a retry whose backoff has ended).
	GroupFree GroupState = "free"
	// GroupLeased: held by a lease token until its expiry: a consumer is
	// handling its head, or a Nack with a delay parked it (a nack's park
	// keeps its token, so the two look the same).
	GroupLeased GroupState = "leased"
	// GroupParked: its head failed (Fail) and waits out the retry backoff.
	GroupParked GroupState = "parked"
	// GroupStopped: its head used its attempts under OnExhausted StopGroup;
	// it waits for RestartGroup.
	GroupStopped GroupState = "stopped"
	// GroupPaused: paused by PauseGroup; never claimed until ResumeGroup.
	GroupPaused GroupState = "paused"
)

// GroupOrder is the order Groups lists groups in.
type GroupOrder string

const (
	// ByGroup: by group id (the zero value).
	ByGroup GroupOrder = "group"
	// OldestHead: the groups whose head was published first (by seq), first.
	// The walk looks at the oldest 100,000 messages at most per call: a
	// page may come back short when a few groups hold more than that many
	// of the oldest messages (those groups are the oldest heads, and are
	// listed).
	OldestHead GroupOrder = "oldest_head"
	// HeldLongest: leased groups only, by when their holder was handed its
	// message (LeasedAt), earliest first: the handlers that have run
	// longest.
	HeldLongest GroupOrder = "held_longest"
	// MostAttempts: groups whose head was handed out more than once, most
	// first: messages that keep failing or lapsing.
	MostAttempts GroupOrder = "most_attempts"
)

// GroupQuery selects a page of groups.
type GroupQuery struct {
	State  GroupState // "" means every state
	Order  GroupOrder // "" means ByGroup
	Offset int        // rows to skip: 0 from the start, else the rows already seen
	Limit  int        // the page size: 0 means DefaultGroupLimit; at most MaxBatch (ErrInvalidBatch)
	Tenant string     // "" means every tenant; else valid UTF-8, no NUL, at most MaxTenantBytes (ErrInvalidTenant)
}

// TenantInfo is one tenant as an operator sees it (docs/design.md,
// "Shares across tenants"): each tenant that has groups, was given a
// weight or has deliveries counted.
type TenantInfo struct {
	Tenant string
	// Weight is its weight, 1 where never set (SetTenantWeight).
	Weight int
	// Groups are its group rows, but the kept rows of drained groups;
	// Leased those held by a lease now (in flight).
	Groups, Leased int64
	// Ready counts its entries in the ready log: its groups waiting their
	// turn (an entry of a group leased since by a sweep counts until a
	// claim passes it).
	Ready int64
	// Share is what it is handed out under contention: its weight over
	// the weights of the tenants with Ready > 0 (0 with none).
	Share float64
	// Delivered counts the messages handed out from its groups so far
	// (each claim's, each kept group's next; a retry again; a lease given
	// back unused not): two readings give its deliveries per second and
	// its measured share (Rates). From schema version 28. Rows deleted,
	// truncated or revived for another tenant leave their counts to it
	// (docs/protocol.md, transport_tenant_counts); it goes back only when
	// a lease counted by an earlier reading is given back unused.
	Delivered int64
}

// TenantRate is one tenant's deliveries between two readings of Tenants
// (Rates).
type TenantRate struct {
	Tenant string
	// PerSecond is its deliveries per second between the readings.
	PerSecond float64
	// Measured is its share of all deliveries between them (0 with
	// none), to set beside its Share.
	Measured float64
}

// Rates is each tenant's deliveries per second and measured share from
// prev to cur, two readings of Tenants taken elapsed apart, in cur's
// order: a tenant new in cur counts from 0, and one whose count went back
// (a lease given back unused) counts 0. A negative elapsed, or none,
// gives zero rates.
func Rates(prev, cur []TenantInfo, elapsed time.Duration) []TenantRate {
	before := make(map[string]int64, len(prev))
	for _, t := range prev {
		before[t.Tenant] = t.Delivered
	}
	out := make([]TenantRate, len(cur))
	var total int64
	for _, t := range cur {
		total += max(t.Delivered-before[t.Tenant], 0)
	}
	for i, t := range cur {
		out[i].Tenant = t.Tenant
		d := max(t.Delivered-before[t.Tenant], 0)
		if elapsed > 0 {
			out[i].PerSecond = float64(d) / elapsed.Seconds()
		}
		if total > 0 && elapsed > 0 {
			out[i].Measured = float64(d) / float64(total)
		}
	}
	return out
}

// GroupInfo is one group as an operator sees it.
type GroupInfo struct {
	Group    string
	Priority int
	State    GroupState
	// Holder is the lease token (workerID:uuid) of a leased group, and of a
	// paused group a holder is still finishing; "" otherwise.
	Holder string
	// LeasedAt is when Holder was handed the message it holds (by a claim,
	// or by an ack that kept the group for its next message; zero if none,
	// or taken before schema version 11): how long its handler has run. Until is when its lease, park or
	// backoff ends (zero: never claimed or freed; for a stopped group, the
	// far future is shown as zero too). Both by the server's clock.
	LeasedAt time.Time
	Until    time.Time
	// HeadSeq is the group's next message (0: none: the group is empty,
	// which only a paused group stays). HeadAge is how long ago it was
	// published (0 for a message queued before schema version 10).
	HeadSeq int64
	HeadAge time.Duration
	// Attempts is how many times the head was handed out (0: never yet).
	Attempts int
	// Tenant is the group's tenant (DefaultTenant where its first publish
	// named none).
	Tenant string
}

// PeekedMessage is one of a group's next messages, read without a lease.
type PeekedMessage struct {
	Seq         int64
	Event       string
	PublishedAt time.Time // by the server's clock; zero before schema version 10
	// LastError is the cause its last Fail gave ("" if none).
	LastError string
}

// Stats is the queue at a glance, read in one round-trip, cheap enough to
// poll: 0.16 s at a million groups and ten million messages (0.55 s before
// the tables were ever analyzed; bench/README.md). Leased,
// parked, stopped and paused groups are counted exactly, through indexes.
// Counts that would scan a table (all groups, messages, dead letters) are
// exact up to 100,000 rows and past that estimated from a random sample
// of the table's pages, scaled to the planner's row estimate (see
// harel_stats in docs/protocol.md): each says which.
type Stats struct {
	// At is when the stats were read, by the server's clock.
	At time.Time
	// Total adds up every priority (its Priority is -1).
	Total PriorityStats
	// ByPriority holds MinPriority..MaxPriority, in order, zeros included.
	ByPriority []PriorityStats
	// Waiting is the number of idle consumers registered for a LISTEN
	// wake-up (transport_waiters): idle async streams, and plain-SQL
	// clients that call harel_wait with a name. A blocking ClaimWait
	// waits without registering, so it is not counted.
	Waiting int64
}

// PriorityStats counts the groups and messages of one priority (a
// group's priority is its first message's).
type PriorityStats struct {
	Priority int
	// Groups = Free + Leased + Parked + Stopped + Paused. Leased, Parked,
	// Stopped and Paused are exact; GroupsExact false: Groups is an
	// estimate, and Free the estimated rest.
	Groups, Free, Leased, Parked, Stopped, Paused int64
	GroupsExact                                   bool
	// Messages queued (including heads being handled). MessagesExact false:
	// an estimate.
	Messages      int64
	MessagesExact bool
	// OldestHeadAge is the age of the oldest message waiting at the head
	// of a group (0: no message, or one queued before schema version 10).
	// OldestHeadExact false: an upper bound (see harel_stats).
	OldestHeadAge   time.Duration
	OldestHeadExact bool
	// DeadLetters of this priority. DeadLettersExact false: an estimate.
	DeadLetters      int64
	DeadLettersExact bool
}
