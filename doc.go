// Package pgtransport is a message queue on PostgreSQL alone: strict FIFO
// per group, one consumer per group at a time, and many workers leasing
// different groups in parallel. A group is an exclusivity key, such as the
// id of a workflow execution whose events must be handled one at a time, in
// order.
//
// This package holds what both transports share: the [Lease] a claim hands
// out, the [Config] both take (with the queue's [Policy] and the
// asynchronous transport's [AsyncConfig]), the errors both return, and the
// guarantees below, which are written here once; the README, docs/ and the
// transports' package docs link here instead of restating them. The
// transports are in two packages with the same methods, each with one
// Transport type over a queue of N ≥ 1 partitions (one database is N = 1):
//
//   - package sync, imported as pgsync "github.com/pgtransport/pgtransport/sync":
//     every method blocks until it is done; ClaimWait blocks until there is
//     work.
//   - package async: every method returns at once with a channel that
//     delivers its one result, and a Stream delivers leases on a channel to
//     a select loop as work appears.
//
// Both run handlers for you: Work(ctx, [WorkerConfig], [Handler]) claims,
// runs at most Concurrency handlers at once, keeps their leases alive with
// one heartbeat round-trip for all of them, acks on nil, Fails on an error
// or a panic, and shuts down gracefully when ctx ends; WorkTx does the same
// with a [TxHandler] whose writes commit with the ack. Config.Logger
// (nil: slog.Default()) gets what an operator must see (lost leases,
// panics, dead letters, reconnects, shutdown timeouts), never a record per
// healthy message at Info or above; Config.Observer gets every publish,
// claim, ack, fail and lost lease with its duration, for metrics.
//
// Other languages speak the same protocol with plain SQL: see
// docs/protocol.md. Running it (poolers, failover, long transactions, the
// command) is docs/operating.md; partitions and their growth,
// docs/partitions.md.
//
// # Guarantees
//
// FIFO per group. A group's messages are handed out one at a time, in
// publish order: a message whose publish committed before another's began
// is handed out first (Publish commits before it returns; PublishTx when
// the caller's transaction commits). A PublishMany batch is in slice
// order. Publishes that overlap in time have no order between them but
// the one their commits give: a claim takes the lowest seq it can see,
// and an uncommitted message is not there yet. A message handed out again
// is always its group's current head.
//
// One holder per group. While a lease holds its group, no claim returns
// any message of that group. Claims of different groups run in parallel
// and never wait for each other's locks (FOR NO KEY UPDATE SKIP LOCKED).
//
// At least once; nothing lost. A published message is handed out until it
// is acked or, having used its attempts, dead-lettered (below); handlers
// should be idempotent. A publish, ack, nack or extend that returned nil
// is durable (PublishTx: once the caller's transaction commits; across a
// failover, see docs/operating.md, "Failover"). A publish that races with
// the ack draining its group never leaves its message without its group.
// A message comes back, as its group's head, when:
//   - its lease runs out (Lease.Expiry, the visibility) with no ack, nack or
//     Extend: the next claim of the group gets it;
//   - it is nacked: Nack(lease, 0) frees the group at once, first in line;
//     Nack(lease, d) parks the group for d;
//   - a claim leased it and the caller never saw the lease (ctx cancelled
//     while the claim ran, a lost connection): after the visibility;
//   - the server crashed before the claim's commit reached disk (claims
//     commit without waiting for their WAL flush): at once, and the old
//     holder's ack is ErrLeaseLost;
//   - an async Stream claimed it and nobody received it from the stream's
//     channel within half the visibility, or the stream stopped first: at
//     once (Release: free, first in line, the hand-out not counted as an
//     attempt). The stream then claims nothing until a
//     receiver takes a lease from its channel or settles one (after
//     min(Config.IdleSweep, half the visibility) with an empty channel, one
//     lease at a time), so other consumers get the groups it gave back;
//   - it is failed (Fail) with attempts left: after the queue's backoff.
//
// Attempts and poison messages. The database counts every hand-out of a
// message (Lease.Attempt, 1 on the first), whatever ended it: ack, nack,
// Fail, or a lease that lapsed because its worker died, so a message that
// crashes its workers counts too. A lease given back unused (a Stream's
// unreceived lease, a shutdown) does not count. The queue's [Policy], kept
// in the database (transport_policy) so every consumer applies it
// (plain-SQL ones included), bounds them: Policy.MaxAttempts
// (DefaultMaxAttempts, 10, when zero; Unlimited retries forever). A head
// that has used them, at its Fail or at the next claim of its group
// (leases that lapsed), is either moved to the dead letters in the same
// transaction, and its group goes on with its next message
// (Policy.OnExhausted DeadLetterHead, the default), or left in place with
// its group stopped until RestartGroup (StopGroup), for those who would
// rather stop than skip. Fail parks the group for a backoff that doubles
// with the attempt, with equal jitter, between Policy.RetryBackoffMin and
// RetryBackoffMax (1 s and 60 s when zero); Nack keeps its exact meaning.
// DeadLetters lists the dead letters, with their last error and when they
// were published and died; Redrive puts them back, each at the head of
// its group in its original order, with fresh attempts;
// PurgeDeadLetters deletes them. Every message is so either acked once or
// dead-lettered once (and, redriven, handed out again). The policy
// changes only by an explicit call: Config.Policy, when non-nil, is
// written whole when the Transport opens, and Transport.SetPolicy writes
// it whole at any time; a zero field means its default, not "leave it".
// With a nil Config.Policy a Transport leaves the stored policy alone.
//
// Idempotent publish. A Message with a DedupKey (PublishMessage,
// PublishMessageTx, PublishMany) whose (group, key) was published within
// Config.DedupWindow (5 minutes unless set), or earlier in the same
// batch, writes nothing and returns the first message's seq; concurrent
// publishes of one key store exactly one message. Inside a caller's
// transaction the key commits or rolls back with it. Expired keys are
// cleaned up in bounded batches, with no job to run.
//
// Publish time. The database records when each message was published (its
// own clock); Lease.PublishedAt gives it by the consumer's clock, so
// time.Since(lease.PublishedAt) is the pickup latency.
//
// Fencing. A lease is its token (workerID:uuid) on its group. Ack, AckNext,
// AckMany, AckTx, AckStateTx, Nack, Fail and Extend act only while that
// token still holds the group; otherwise they return ErrLeaseLost (AckMany
// per lease) and change nothing (AckTx and AckStateTx before the caller
// commits, so the caller rolls back). A lease past its expiry still holds
// until another claim takes the group. An Ack or AckMany of a message
// already acked (a second ack, or an ack of a kept lease's earlier
// message) is ErrLeaseLost too; an AckNext of a kept lease's earlier
// message is taken as the retry of the AckNext that kept it and returns
// the same next message.
//
// Exactly once, for effects in the same database. AckTx and AckStateTx ack
// inside the caller's transaction, fenced as Ack is, so the caller's
// writes, the group's state (AckStateTx) and the ack commit together or
// not at all; WorkTx is the runtime built on them. A message's writes are
// then applied exactly once, a group's in publish order, however a worker
// dies, a lease lapses or a reply is lost: a COMMIT whose reply is lost
// acked the message if and only if the writes committed. A group's state
// (at most MaxStateSize; State and StateTx read it, unfenced) is written
// only that way: a stale holder never overwrites it. It lives on the
// group's row while the group has messages, and after the group drains
// for Policy.StateRetention (none when zero); while it lives, the state
// a handler is given is the fold of the group's earlier messages
// (dead-lettered ones never folded in).
//
// Lost replies. A call whose request reached the database but whose reply
// was lost (the connection broke after the commit, or ctx ended while it
// ran) returns an error that errors.Is ErrOutcomeUnknown, never
// ErrLeaseLost: each round-trip is one transaction, so it applied whole or
// not at all, and each method's doc says what the caller may assume. A
// publish may have appended its messages (publishing again may add
// copies; a DedupKey makes the retry safe); a claim may have leased
// groups nobody holds (they come back after the visibility); an ack,
// nack or extend either applied or left the lease as it was, and
// repeating it while the lease holds tells which. A Stream resolves its
// own acks: after a lost reply it retries them, and answers nil for an
// ack whose message is gone while its lease could not have lapsed (only
// the group's holder deletes messages), ErrLeaseLost only for one whose
// message is still queued, and ErrOutcomeUnknown otherwise (the message
// is not queued any more). An ack the database refuses for good is
// answered that error alone: no lease can stop a stream.
//
// Round-robin. Groups are handed out in the order they became claimable
// (published to when idle, or freed with messages left), each handed out
// once. AckNext (and a Stream's ack) may keep a group that has more
// messages under the same lease, with no claim in between, for at most
// Config.MaxKeep messages in a row (default 16), and for at most
// Config.KeepWhileWaiting (default 4) while another group waits to be
// claimed; then the group goes to the end of the line. So a group that
// becomes claimable waits at most about as many hand-outs as there are
// claimable groups, times KeepWhileWaiting (1: plus one message of each
// lease then held). bench -only fairness measures the wait (1,000 groups,
// 64 in flight: 3,900 hand-outs at the 99th percentile by default, 1,040
// at 1, 14,400 where keeps never yield) and TestKeepYieldsToWaitingGroups
// (schema) checks the bound at 1. A group whose failed message (Fail) has
// waited out its backoff, a group given back unused, or nacked with no
// delay, comes first; a lease whose holder went away is found within
// about a second under load.
//
// Tenants. A group belongs to a tenant, set by the publish that creates
// it (Message.Tenant; DefaultTenant where none is named). The claims share
// among tenants: under contention each tenant with ready groups gets
// turns in proportion to its weight (SetTenantWeight, 1 to
// MaxTenantWeight, default 1), however many groups it has; round-robin
// over a tenant's groups; FIFO within a group. A turn is a group handed
// out for up to KeepWhileWaiting messages (one for a claim and an ack), so
// shares of messages follow the weights where turns are as long; a tenant
// whose groups hold fewer messages gets fewer a turn, never more. A lone
// tenant uses every consumer. With T tenants of equal weight, a tenant's
// group that becomes claimable waits for about one turn of each other
// tenant. Retries and lapsed leases are charged to their tenant as turns.
// With no tenant named anywhere, the order is the one above.
// Over partitions the shares hold per partition. Tenants lists each
// tenant's weight, groups, share and deliveries so far; Rates turns two
// readings into deliveries per second and the share measured;
// GroupQuery.Tenant lists one tenant's groups. docs/design.md, "Shares
// across tenants", and docs/protocol.md, "Tenants", say how.
//
// Priorities. A group's priority (0 to 4) is set by the publish that
// creates the group and resets once the group drains; later publishes do
// not change it. A claim's minPriority is a floor, not an order: it takes
// only groups at or above it, in round-robin order among them. Run workers
// with a higher floor to keep capacity for urgent groups.
//
// Clocks. Leases and parks run on the database server's clock, so workers'
// clocks need not agree. Lease.Expiry and Lease.PublishedAt are by the
// consumer's own clock (Expiry: when the claim was sent plus the
// visibility, never later than the server's lease end), so
// time.Until(lease.Expiry) is the time left however far the server's
// clock is from the consumer's. Config.Clock injects one for deterministic
// tests.
//
// Partitions. A queue spread over several databases (NewCluster,
// OpenCluster; docs/partitions.md) keeps every guarantee above within a
// group: a group lives on one partition (Transport.Home; while the
// queue grows, Transport.Locate), so its order, its one holder, its
// fencing and its state are that partition's. Across partitions:
//   - Claim, ClaimMany and ClaimWait try the partitions in turn until they
//     lease, so a claim comes back empty only when no partition it reached
//     has claimable work (a partition that is down is passed over); the
//     round-robin holds within each partition, the priority floor on all.
//   - Work, WorkTx and a Stream give each partition its share of the
//     slots (at least one each).
//   - PublishMany and AckMany are atomic per partition, not across: on an
//     error the parts of the partitions that succeeded are applied (a
//     publish's come back with their seqs, the others with 0).
//   - PublishTx, PublishMessageTx, AckTx, AckStateTx and StateTx run in the
//     caller's transaction, which must be on the group's partition (open it
//     on Transport.Partition(Locate(group))): atomic with the caller's
//     writes there only; another database's transaction is refused
//     (ErrInvalidConfig) before anything is written.
//   - DeadLetters, Redrive, PurgeDeadLetters, Stats and Groups act on every
//     partition and merge.
//   - Seqs are unique across partitions but order messages only within one.
//   - A Transport opened before the queue grew keeps working, but a publish
//     of a group that has left its old partition is refused with
//     ErrGroupMoved, nothing written: reopen it.
//
// # What blocks
//
// No claim waits for work except sync ClaimWait, async ClaimWait and a
// Stream: Claim and ClaimMany return nothing (nil, or an empty slice) when
// nothing is claimable. Idle ClaimWait callers and idle streams do not poll:
// an ack, nack or publish through the same Transport wakes one of them per
// group it may have made claimable (PublishTx none: its message is
// invisible until the caller commits; docs/design.md, "Wake-ups: which
// writes notify", has the rule); otherwise they look again when the
// earliest lease or park they saw runs out, and at least every
// Config.IdleSweep (work freed by another process is found then). Idle
// streams also wake on a notification of a new group (LISTEN/NOTIFY, one
// connection per pool) unless Config.Async.DisableNotify.
//
// FromDSN and OpenCluster wait, with backoff, for a server that does not
// accept connections yet, up to Config.MaxConnectWait. A Stream never
// drops a lease: it holds at most StreamConfig.MaxInFlight (received and
// not yet settled, plus those waiting in its channel; over N partitions,
// at least N: each partition's stream gets one slot or more) and claims
// only into free slots, so a slow receiver slows the claims.
//
// A ctx that ends makes a call return an error that errors.Is ctx's error
// (context.Canceled, context.DeadlineExceeded); only an async Ack already
// queued in its stream's next round-trip completes with that round-trip.
//
// # Goroutines and channels
//
// A sync Transport on one database starts no goroutine; Work's handlers
// run in goroutines Work waits for. Over partitions, a sync call that spans
// them runs one goroutine per partition and waits for them, and ClaimWait's
// waits belong to the Transport, which Close ends. Every goroutine package
// async starts belongs to a Transport (or to a Stream, which the
// Transport's Close also stops), and Close stops and waits for them; it is
// safe to call twice.
//
// Each async call's channel is buffered and delivers exactly one result;
// it is never closed, and nobody needs to receive from it. A Stream's
// channel C is closed by the stream, and only when it stops (its ctx
// ended, Close of the stream or of the Transport, or ErrSchemaMissing);
// then Err says why. The caller closes nothing but the Transport and its
// streams.
//
// # Errors
//
// Bad input gets a typed error and nothing is written: ErrInvalidGroup
// (empty, NUL, invalid UTF-8, over MaxGroupBytes), ErrInvalidEvent (NUL,
// invalid UTF-8), ErrEventTooLarge (over Config.MaxEventBytes, 1 MiB
// unless set), ErrInvalidPriority (outside 0 to 4), ErrInvalidVisibility
// (under MinVisibility: a lease must outlive the round-trips that use
// it), ErrInvalidDelay (negative), ErrNilLease, ErrInvalidWorkerID,
// ErrInvalidSchema, ErrInvalidBatch, ErrInvalidConfig, ErrInvalidDedupKey,
// ErrInvalidTenant, ErrInvalidWeight, ErrStateTooLarge. A missing schema is ErrSchemaMissing, a closed
// transport ErrClosed, a RestartGroup of a group that is not stopped
// ErrGroupNotStopped, a pooler in an unsafe exec mode ErrPoolerExecMode
// (docs/operating.md), a publish to a partition its group has left
// ErrGroupMoved. Check them with errors.Is.
//
// # Schema
//
// Opening a Transport (New, FromDSN; NewCluster and OpenCluster on each
// partition) brings the schema up to date before it returns, unless
// Config.SkipApply: idempotent, in one transaction under an advisory lock,
// so any number of workers may start at once, with the version recorded in
// transport_schema_version; a schema a newer library applied is left
// alone. Config.Schema places every table and function in a named schema,
// created if absent; queues in two schemas never see or wake each other.
// Teams with their own migration tool load the script from schema.SQL (or
// `make schema`) and set SkipApply; worker roles need only what
// schema.Grants returns (docs/operating.md, "Least privilege").
// PostgreSQL 14 or newer.
package pgtransport
