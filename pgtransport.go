package pgtransport

import (
	"errors"
	"log/slog"
	"time"
)

// Limits on what a publish or claim accepts. Inputs beyond them are refused
// with a typed error before anything is sent to the database.
const (
	// MinPriority and MaxPriority bound a group's priority.
	MinPriority = 0
	MaxPriority = 4
	// MaxGroupBytes bounds a group id, so it always fits a btree index entry.
	MaxGroupBytes = 1024
	// MaxWorkerIDBytes bounds a worker id (it becomes part of the lease token).
	MaxWorkerIDBytes = 256
	// DefaultMaxEventBytes is the event size limit when Config.MaxEventBytes is 0.
	DefaultMaxEventBytes = 1 << 20
	// DefaultMaxConnectWait is how long FromDSN retries when Config.MaxConnectWait is 0.
	DefaultMaxConnectWait = time.Minute
	// DefaultIdleSweep is Config.IdleSweep's value when it is 0.
	DefaultIdleSweep = time.Second
	// DefaultMaxKeep is Config.MaxKeep's value when it is 0.
	DefaultMaxKeep = 16
	// DefaultKeepWhileWaiting is Config.KeepWhileWaiting's value when it is 0.
	DefaultKeepWhileWaiting = 4
	// MaxBatch bounds the messages of one round-trip: of ClaimMany and
	// AckMany, and a stream's MaxInFlight. PublishMany sends a longer
	// batch in chunks of MaxBatch, in one transaction.
	MaxBatch = 10_000
	// DefaultPoolSize is how many connections the pool FromDSN opens may
	// hold when the dsn does not say (pool_max_conns=N; pgx's own default
	// is the larger of 4 and the number of CPUs, and the larger wins). A
	// pool opens connections only as they are needed. Each round-trip in
	// flight holds one: a blocking worker runtime one per handler slot
	// (Concurrency) and one for its heartbeat; a stream up to two; a
	// ClaimWait one while it claims. Notifications take one more, outside
	// the pool. So 20 serves a runtime at the default Concurrency (16)
	// with room for the process's publishes; size the pool to
	// Concurrency plus 4 for more, through the dsn or with a pool of
	// your own (New).
	DefaultPoolSize = 20
	// MinVisibility is the shortest lease a claim, AckNext, Extend or
	// stream accepts. A lease must outlive the round-trips that use it
	// (the claim's reply, then the ack) with room for a busy pool, a GC
	// pause or a distant server; a shorter one would lapse before its
	// holder could act on it, so it is a mistake (often a bare number
	// where a time.Duration of seconds was meant: 30 is 30 ns).
	MinVisibility = time.Second
	// MaxDedupKeyBytes bounds a Message.DedupKey.
	MaxDedupKeyBytes = 256
	// MaxTenantBytes bounds a tenant id (Message.Tenant, SetTenantWeight).
	MaxTenantBytes = 256
	// DefaultTenant is the tenant of a group whose first publish names
	// none (Message.Tenant ""), and of the design's plain two-INSERT
	// publish.
	DefaultTenant = "default"
	// MaxTenantWeight bounds a tenant's weight (SetTenantWeight); a
	// tenant never given one weighs 1.
	MaxTenantWeight = 1000
	// MaxErrorBytes bounds the cause Fail records on a message: a longer
	// text is cut, at a rune boundary, to this many bytes.
	MaxErrorBytes = 2048
	// DefaultDedupWindow is Config.DedupWindow's value when it is 0: as
	// Amazon SQS's deduplication interval.
	DefaultDedupWindow = 5 * time.Minute
	// MaxDedupWindow bounds Config.DedupWindow.
	MaxDedupWindow = 24 * time.Hour
	// DefaultMaxAttempts is a new queue's attempt limit (Policy.MaxAttempts).
	DefaultMaxAttempts = 10
	// Unlimited, as Policy.MaxAttempts, makes the queue retry a message
	// forever: it is never dead-lettered (nor its group stopped).
	Unlimited = -1
	// DefaultRetryBackoffMin and DefaultRetryBackoffMax are a new queue's
	// bounds of the backoff after a Fail (Policy.RetryBackoffMin, Max).
	DefaultRetryBackoffMin = time.Second
	DefaultRetryBackoffMax = time.Minute
	// MinRetryBackoff and MaxRetryBackoff bound either backoff bound a
	// Policy sets.
	MinRetryBackoff = time.Millisecond
	MaxRetryBackoff = 24 * time.Hour
	// DefaultDeadLetterLimit is a DeadLetterQuery's page size when its
	// Limit is 0 (at most MaxBatch).
	DefaultDeadLetterLimit = 100
	// MaxStateSize bounds a group's state (AckStateTx, a TxHandler's
	// result), in bytes.
	MaxStateSize = 256 << 10
	// MaxStateRetention bounds Policy.StateRetention.
	MaxStateRetention = 365 * 24 * time.Hour
)

// Errors, checked with errors.Is. Input errors are returned before anything
// is written.
var (
	// ErrLeaseLost: the lease's token no longer holds its group (the lease
	// lapsed and another worker claimed the group, or it was already settled).
	// The call changed nothing.
	ErrLeaseLost = errors.New("pgtransport: lease lost")
	// ErrNilLease: a nil *Lease was passed.
	ErrNilLease = errors.New("pgtransport: nil lease")
	// ErrInvalidGroup: a group id that is empty, longer than MaxGroupBytes,
	// not valid UTF-8, or holds a NUL byte.
	ErrInvalidGroup = errors.New("pgtransport: invalid group id")
	// ErrClockSkew: the "now" a call passed is farther from the database
	// server's clock than the server's bound (the setting
	// pgtransport.max_clock_skew, 10 s unless set; see docs/protocol.md).
	// The Go client passes the server's own clock, and turns the bound off
	// for its statements when Config.Clock is set.
	ErrClockSkew = errors.New("pgtransport: clock too far from the server's")
	// ErrInvalidEvent: an event that is not valid UTF-8 or holds a NUL byte.
	ErrInvalidEvent = errors.New("pgtransport: invalid event")
	// ErrEventTooLarge: an event longer than the configured MaxEventBytes.
	ErrEventTooLarge = errors.New("pgtransport: event too large")
	// ErrInvalidPriority: a priority outside MinPriority..MaxPriority.
	ErrInvalidPriority = errors.New("pgtransport: invalid priority")
	// ErrInvalidVisibility: a visibility (lease length) shorter than
	// MinVisibility.
	ErrInvalidVisibility = errors.New("pgtransport: invalid visibility")
	// ErrInvalidDelay: a negative nack delay.
	ErrInvalidDelay = errors.New("pgtransport: invalid delay")
	// ErrInvalidWorkerID: a worker id that is empty, longer than
	// MaxWorkerIDBytes, not valid UTF-8, or holds a NUL byte.
	ErrInvalidWorkerID = errors.New("pgtransport: invalid worker id")
	// ErrInvalidSchema: a schema name PostgreSQL cannot hold (empty is fine:
	// it means the connection's current schema).
	ErrInvalidSchema = errors.New("pgtransport: invalid schema name")
	// ErrUnreachable: FromDSN or OpenCluster retried a database that did
	// not accept connections (refused, not resolvable yet, starting up,
	// too many connections) for all of Config.MaxConnectWait; the error
	// wraps the last connection error too. A refusal that waiting cannot
	// heal (a database or role that does not exist, a wrong password, a
	// role that may not connect) is not retried: it is returned at once,
	// wrapping the server's *pgconn.PgError.
	ErrUnreachable = errors.New("pgtransport: database unreachable")
	// ErrInvalidConfig: a Config field out of range.
	ErrInvalidConfig = errors.New("pgtransport: invalid config")
	// ErrSchemaMissing: the tables or functions are not there; apply the
	// schema (Config.SkipApply unset, or schema.Apply, or `make schema`).
	ErrSchemaMissing = errors.New("pgtransport: schema not applied")
	// ErrInvalidBatch: a batch that is empty where it must not be, larger
	// than MaxBatch, or a batch size out of range.
	ErrInvalidBatch = errors.New("pgtransport: invalid batch")
	// ErrClosed: the transport was closed (every method of either
	// front-end returns it after Close), or the pool under it was.
	ErrClosed = errors.New("pgtransport: transport closed")
	// ErrStreamClosed: an async Stream's Err after its own Close (after
	// the Transport's Close it is ErrClosed). errors.Is(ErrStreamClosed,
	// ErrClosed) holds, so a check for ErrClosed covers both.
	ErrStreamClosed error = streamClosed{}
	// ErrOutcomeUnknown: the call may have reached the database, but no
	// reply came back (the connection broke, or ctx ended, while it ran),
	// so it may or may not have applied; the error wraps the cause too (a
	// connection error, or ctx's error). Each method's doc says what the caller may
	// assume. In short: the call's transaction either committed whole or
	// not at all, and a lease it concerns is never held for good (it
	// lapses after its visibility at the latest). It errs on the safe side:
	// a ctx that ended while the call waited for a pool connection also
	// reports it (pgx tells that apart from a ctx that ended mid-call only
	// by its place, not its error), and so does a call inside a caller's
	// transaction (PublishTx, or a Transport on a pgx.Tx), where a lost
	// connection means the transaction is gone and nothing of it applied.
	ErrOutcomeUnknown = errors.New("pgtransport: outcome unknown")
	// ErrInvalidDedupKey: a Message.DedupKey longer than MaxDedupKeyBytes,
	// not valid UTF-8, or holding a NUL byte ("" means no key).
	ErrInvalidDedupKey = errors.New("pgtransport: invalid dedup key")
	// ErrInvalidTenant: a tenant id longer than MaxTenantBytes, not valid
	// UTF-8 or holding a NUL byte (Message.Tenant; "" there means
	// DefaultTenant; GroupQuery.Tenant, "" there means every tenant), or
	// empty where a tenant is named (SetTenantWeight). Nothing was
	// written.
	ErrInvalidTenant = errors.New("pgtransport: invalid tenant")
	// ErrInvalidWeight: a tenant weight outside 1 to MaxTenantWeight.
	// Nothing was written.
	ErrInvalidWeight = errors.New("pgtransport: invalid tenant weight")
	// ErrGroupNotStopped: RestartGroup of a group that is not stopped (the
	// queue's policy is not StopGroup, its head has attempts left, or it
	// was restarted already). Nothing changed.
	ErrGroupNotStopped = errors.New("pgtransport: group not stopped")
	// ErrStateTooLarge: a group state longer than MaxStateSize (AckStateTx,
	// a TxHandler's result). Nothing was written.
	ErrStateTooLarge = errors.New("pgtransport: state too large")
	// ErrGroupMoved: a publish of a group in a partition that is no
	// longer its home (the cluster grew, and the group has nothing left
	// in its old partition: docs/protocol.md, "Growing the cluster").
	// Nothing was written. A Transport opened before the growth gets it;
	// reopen it (OpenCluster reads the grown map). A PublishTx gets it
	// if its group left the partition between Transport.Locate and the
	// insert: roll back and retry.
	ErrGroupMoved = errors.New("pgtransport: group moved to another partition")
)

// Lease is one claimed message: the head of Group, held by Token until it is
// acked, nacked, or Expiry passes. While the lease holds, no other worker is
// handed any message of Group.
type Lease struct {
	Group string
	Seq   int64 // the message's position; FIFO within Group follows it
	Event string
	Token string // workerID:uuid, unique to this claim
	// Expiry is when the lease lapses, by this process's clock, whatever
	// the database server's clock says: time.Until(Expiry) is the time
	// left. It is the time the claim (or the AckNext that kept the group)
	// was sent plus its visibility; the server starts the lease when the
	// statement reaches it, later, so the lease holds at least until
	// Expiry and a deadline taken from it never outlives it. Extend does
	// not move it (the new end is the Extend's start plus its visibility).
	Expiry time.Time
	// Kept counts the messages of Group this lease took in a row before
	// this one (an ack that keeps a hot group hands on the lease with Kept
	// one higher). 0 for a fresh claim.
	Kept int
	// Attempt is how many times the database has handed out this message,
	// this one included: 1 on its first delivery. Every hand-out counts,
	// whatever ended it (ack, nack, Fail, or a lease that lapsed because
	// its worker died); a lease a stream or a shutdown gave back unused
	// does not. The queue's policy (Policy.MaxAttempts) bounds it.
	Attempt int
	// PublishedAt is when the message was published, by this process's
	// clock: the time the claim was sent less the message's age as the
	// database measured it, so time.Since(PublishedAt) is its pickup
	// latency whatever the server's clock says (a little more than the
	// truth, by at most the claim's trip to the server). Zero when unknown
	// (a message queued before schema version 10).
	PublishedAt time.Time
}

// Message is one message to publish.
type Message struct {
	Group    string
	Event    string
	Priority int // used only if the message creates its group
	// DedupKey, if not "", makes the publish idempotent: a publish whose
	// (Group, DedupKey) was published within Config.DedupWindow (or earlier
	// in the same batch) writes nothing and returns the seq of that first
	// message. The Event is not compared: a different event under a key
	// already seen is dropped all the same. (Seqs still rise, with gaps.)
	// At most MaxDedupKeyBytes, valid UTF-8, no NUL byte.
	DedupKey string
	// Tenant is the tenant the group belongs to, set by the message that
	// creates its group (as Priority; "" is DefaultTenant); a later one
	// that names a tenant changes nothing, and one that names none leaves
	// the group's. Under contention tenants get turns in proportion to
	// their weights (SetTenantWeight) however many ready groups each has,
	// round-robin over a tenant's groups, FIFO within a group (the
	// package doc, "Tenants"). At most MaxTenantBytes, valid UTF-8, no NUL
	// byte.
	Tenant string
}

// Exhausted is what the queue does with a group's head once it has used
// its attempts (Policy.OnExhausted).
type Exhausted string

const (
	// DeadLetterHead moves the head to transport_dead_letters (see
	// DeadLetters, Redrive) and the group goes on with its next message.
	// A new queue's choice.
	DeadLetterHead Exhausted = "dead_letter"
	// StopGroup leaves the head in place and stops its group: nothing of
	// the group is handed out until RestartGroup, so its order is never
	// broken.
	StopGroup Exhausted = "stop"
)

// DeadLetter is a message that used its attempts and was moved out of its
// group (Exhausted DeadLetterHead).
type DeadLetter struct {
	Group    string
	Seq      int64 // its seq when queued; a redrive puts it back with it
	Event    string
	Priority int // its group's priority when it died
	Attempts int // the hand-outs it had
	// LastError is the cause of the last Fail, "" if it never failed
	// (its leases lapsed).
	LastError string
	// PublishedAt and DiedAt are by the database server's clock.
	// PublishedAt is zero for a message queued before schema version 10.
	PublishedAt time.Time
	DiedAt      time.Time
}

// DeadLetterQuery selects a page of dead letters, in seq order.
type DeadLetterQuery struct {
	Group string // "" means every group
	After int64  // only seqs after it: 0 from the start, else the last Seq of the previous page
	Limit int    // the page size: 0 means DefaultDeadLetterLimit; at most MaxBatch
}

// DeadLetterFilter selects the dead letters Redrive and PurgeDeadLetters act
// on: those of Group ("" means every group) whose seq is in Seqs. Seqs nil
// means every seq; a non-nil empty Seqs selects nothing (so a list that
// came out empty never acts on them all). At most MaxBatch seqs.
type DeadLetterFilter struct {
	Group string
	Seqs  []int64
}

// Config configures a transport. The zero value works: objects in the
// connection's current schema, the database server's clock, the schema
// applied on open, a 1 MiB event limit.
type Config struct {
	// Schema places every table and function in this PostgreSQL schema
	// (created if absent). Empty means the connection's current schema and
	// unqualified names, exactly as the design writes them. Two transports
	// in different schemas never see each other's messages. The name is
	// used verbatim, as a quoted identifier: case and punctuation count
	// ("MyQueue" is not myqueue).
	Schema string

	// SkipApply leaves the schema alone on open: for teams that load the
	// script (`make schema`, schema.SQL) with their own migration tool,
	// and for workers whose role may not change it. A Policy is still
	// applied on open.
	SkipApply bool

	// Clock, if set, supplies "now" for leases, parks and acks. Nil means
	// the database server's clock, so workers' clocks need not agree; a
	// Clock is for deterministic tests. The server refuses a "now" far
	// from its own clock (ErrClockSkew; the setting
	// pgtransport.max_clock_skew), so with a Clock the transport's
	// statements turn that bound off for their own transactions (for a
	// transport opened on a pgx.Tx, until that transaction ends).
	Clock func() time.Time

	// MaxEventBytes bounds an event's size in bytes. 0 means
	// DefaultMaxEventBytes.
	MaxEventBytes int

	// MaxConnectWait bounds how long FromDSN and OpenCluster retry a
	// database that does not accept connections yet (refused, a host name
	// not resolvable yet, the server starting up or shutting down, too
	// many connections), logging each kind of cause once at Warn; then
	// they return ErrUnreachable. What waiting cannot heal (a database or
	// role that does not exist, a wrong password) fails at once. 0 means
	// DefaultMaxConnectWait.
	MaxConnectWait time.Duration

	// IdleSweep bounds how long an idle async consumer sleeps without
	// looking for work: the fallback for work no notification announces (a
	// group freed with messages left by another process, a park set by
	// another process while the consumer slept, a lease whose holder went
	// away, a notification lost while the listener reconnected). 0 means
	// DefaultIdleSweep.
	IdleSweep time.Duration

	// MaxKeep bounds how many messages of one group a lease may take in a
	// row when an ack keeps it (sync AckNext; async streams always try):
	// a hot group is served without a claim per message, and after MaxKeep
	// (KeepWhileWaiting while another group waits) it goes back to the
	// round-robin, so other groups are not starved. Higher: more
	// throughput on hot groups, a longer wait for the others.
	// 0 means DefaultMaxKeep; -1 never keeps.
	MaxKeep int

	// KeepWhileWaiting bounds how many messages of one group a lease may
	// take in a row while another group waits to be claimed: past it, an
	// ack that would keep the group frees it instead, behind the waiting
	// ones. So a group that becomes claimable waits for about the claimable
	// groups ahead of it times KeepWhileWaiting hand-outs (doc.go,
	// "Round-robin"). Lower is fairer and, under a backlog over many
	// groups, slower: 1 yields at once, so that every message is a claim.
	// 0 means DefaultKeepWhileWaiting; MaxKeep or more never yields.
	KeepWhileWaiting int

	// Policy, if set, is applied on open as SetPolicy applies it: the
	// queue's policy (attempts, retry backoff, what an exhausted head
	// becomes, state retention), kept in the database for every consumer.
	// Nil leaves the stored policy alone, so a worker's Config need not
	// carry it (and its role need not be allowed to write it): set it
	// where the queue is owned, or call SetPolicy. A non-nil Policy is
	// written only where it differs from the stored one.
	Policy *Policy

	// DedupWindow is how long a Message.DedupKey published through this
	// transport holds off a duplicate. 0 means DefaultDedupWindow; at most
	// MaxDedupWindow.
	DedupWindow time.Duration

	// Logger receives what an operator must see: lost leases, panics in
	// handlers (with their stack), dead-lettered messages and stopped
	// groups (those a Fail decides; a head whose last lease lapsed is
	// dead-lettered by the next claim, in the database, unlogged: watch
	// DeadLetters), listener and stream reconnects, shutdown timeouts. Trouble
	// is logged at Warn or Error; events of single messages (a claim, an
	// ack, a give-back) at Debug only, so a healthy busy system logs
	// nothing per message. Nil means slog.Default() (looked up at each
	// record, so a later slog.SetDefault applies; a running Work keeps the
	// one of when it started): trouble reaches the
	// application's log unless it says otherwise. To log nothing, pass
	// slog.New(slog.DiscardHandler).
	Logger *slog.Logger

	// Observer, if set, is told of every publish, claim, ack, fail and
	// lost lease, with durations: the hook for metrics (see Observer).
	// Nil means none, at no cost: the transport then neither calls it nor
	// times the calls.
	Observer Observer

	// Pooling says whether the connections the transport is given keep
	// their session between transactions, which decides two things a
	// transaction pooler (PgBouncer's pool_mode=transaction) breaks:
	// pgx's query exec mode, and notifications. PoolingDetect (the zero
	// value) asks the server on open (see PoolingDetect for how, and what
	// it cannot see); PoolingSession and PoolingTransaction say it
	// outright. Behind a transaction pooler the transport refuses pgx's
	// statement-caching exec modes (ErrPoolerExecMode), and an async
	// Transport listens only through ListenDSN: without one its streams
	// find work every IdleSweep and their Ready never closes.
	Pooling Pooling

	// Async holds the settings only an async Transport acts on (its
	// listener and its vacuuming). The blocking transport refuses a
	// non-zero Async (ErrInvalidConfig) rather than ignore it.
	Async AsyncConfig
}

// AsyncConfig is what only an async Transport acts on: how its streams
// hear of new work (LISTEN/NOTIFY, through the pool or ListenDSN) and its
// own vacuuming. The zero value listens through the pool, probes the
// listening connection every 10 s, and leaves vacuuming to autovacuum.
// The blocking transport has no listener: its idle ClaimWait callers
// look again every Config.IdleSweep, and it refuses a non-zero
// AsyncConfig.
type AsyncConfig struct {
	// DisableNotify turns LISTEN/NOTIFY off for the async transport's
	// consumers: they neither listen nor ask publishers to notify them, and
	// look for work every IdleSweep when idle. Publishers never notify on
	// their own account; only idle, listening consumers make them (see
	// harel_wake in the schema's functions), so a system whose
	// consumers all set this sends no notification at all.
	DisableNotify bool

	// ListenDSN, if set, is a connection string straight to PostgreSQL,
	// bypassing any pooler, on which an async Transport listens for
	// notifications: one connection per process and ListenDSN, instead of
	// one taken out of the transport's pool. It is what makes streams wake
	// at once behind a transaction pooler, through which LISTEN never
	// delivers. Each connect checks that it reached PostgreSQL itself: one
	// that went through a pooler is closed, logged and retried, and the
	// streams look for work every IdleSweep meanwhile. Ignored with
	// DisableNotify.
	ListenDSN string

	// ListenPing is how long an async Transport's listening connection may
	// go without a notification before it is probed: a NOTIFY on a channel
	// of the listener's own, sent through the Transport's pool, which must
	// come back on the listening connection within 5 s. The guarantee:
	// streams are never reported ready (Stream.Ready) for longer than
	// ListenPing + 5 s after their listening connection stops delivering
	// (a hung server, a network path that drops packets but keeps the TCP
	// connection, a listener left on the old primary while the pool has
	// moved to the new one); the listener then reconnects, through a
	// multi-host DSN to whichever host answers, and the streams sweep for
	// work. Shorter finds such a connection sooner, at one tiny NOTIFY per
	// interval while idle. 0 means 10 s (notify.DefaultPingInterval);
	// negative turns the check off. The first Transport on a pool (or
	// ListenDSN) sets it for the listener they share, which probes through
	// the pool of the longest-standing Transport still open. Ignored with
	// DisableNotify.
	ListenPing time.Duration

	// Vacuum, if positive, makes an async Transport vacuum the queue
	// tables itself, checking this often and vacuuming a table once it has
	// 1,000 dead rows. Queue tables churn: every claim and ack leaves a
	// dead row. Leave it 0 where autovacuum runs (the schema tunes it per
	// table); set it where autovacuum is off or cannot keep up. Needs a
	// role that may VACUUM the tables (their owner).
	Vacuum time.Duration
}

// Policy is the queue's policy, kept in the database (transport_policy,
// one row per partition) so that every consumer applies it, plain-SQL ones
// included. It changes only by an explicit call: Config.Policy on open, or
// SetPolicy. A zero field means that field's default, not "leave it".
type Policy struct {
	// MaxAttempts is the limit on hand-outs of one message
	// (Lease.Attempt): once a message has been handed out this many times
	// without an ack, the queue does OnExhausted with it, at the Fail of
	// the last attempt or at the next claim of its group (its last lease
	// lapsed). 0 means DefaultMaxAttempts; Unlimited retries forever.
	MaxAttempts int

	// RetryBackoffMin and RetryBackoffMax bound how long a Fail parks the
	// group: RetryBackoffMin·2^(attempt-1), capped at RetryBackoffMax, with
	// equal jitter (between half that and all of it), never below
	// RetryBackoffMin. 0 means DefaultRetryBackoffMin and
	// DefaultRetryBackoffMax; else MinRetryBackoff to MaxRetryBackoff, min
	// not above max.
	RetryBackoffMin time.Duration
	RetryBackoffMax time.Duration

	// OnExhausted is what the queue does with a head that used its
	// attempts: DeadLetterHead ("" means it) or StopGroup.
	OnExhausted Exhausted

	// StateRetention is how long a group's state (AckStateTx, WorkTx) is
	// kept after the group drains (its last message acked, its row
	// deleted), so the group's next message finds it again. 0 keeps none
	// (the state goes with the group row); at most MaxStateRetention.
	StateRetention time.Duration
}

// Pooling is what Config.Pooling says of a transport's connections.
type Pooling string

const (
	// PoolingDetect compares, on open, the process id the server reported
	// at connect (the protocol's BackendKeyData) with pg_backend_pid() on
	// the same connection. PostgreSQL reports its own; PgBouncer, in every
	// pool mode, reports a key of its own making; RDS Proxy reports none.
	// A difference means a pooler, taken to pool transactions. A pooler
	// that passes the server's key through is not seen (say
	// PoolingTransaction), and a session-mode pooler is taken for a
	// transaction-mode one (say PoolingSession).
	PoolingDetect Pooling = ""
	// PoolingSession: every connection keeps its session (no pooler, or a
	// session-mode one): nothing is checked.
	PoolingSession Pooling = "session"
	// PoolingTransaction: a transaction pooler lies between, detected or
	// not.
	PoolingTransaction Pooling = "transaction"
)

// ErrPoolerExecMode: the transport's connections go through a transaction
// pooler (Config.Pooling) and use a pgx query exec mode that keeps state in
// the server session: cache_statement (pgx's default) names prepared
// statements the next transaction may not find, or finds another client's;
// describe_exec sends a statement's parse and its execution in two
// transactions. Choose exec, cache_describe or simple_protocol (the DSN's
// default_query_exec_mode, or pgx.ConnConfig.DefaultQueryExecMode).
var ErrPoolerExecMode = errors.New("pgtransport: query exec mode unsafe behind a transaction pooler")

// streamClosed is ErrStreamClosed: its own text, and ErrClosed to errors.Is.
type streamClosed struct{}

func (streamClosed) Error() string        { return "pgtransport: stream closed" }
func (streamClosed) Is(target error) bool { return target == ErrClosed }
