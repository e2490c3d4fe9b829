package core

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// The statements every front-end sends: one round-trip each, all logic in the
// server-side functions (schema/sql). "now" is $now: the injected clock's
// epoch seconds, or NULL for the database server's clock, so workers' clocks
// never need to agree. {s} is the quoted schema prefix, or nothing. {k}
// and {kfrom} are nothing, or, for a core with an injected clock, skewOff
// (as a column of the subquery that computes now, or a FROM of its own).
const (
	// skewOff turns the functions' clock-skew bound
	// (pgtransport.max_clock_skew, see schema/sql/functions/15_checks.sql) off for
	// the statement's transaction. Only a core with Config.Clock sends it:
	// its now is a test's, not the server's. Evaluated before the function
	// call (a volatile column of a subquery the call reads from). Inside a
	// caller's transaction it lasts until that transaction ends.
	skewOff = `set_config('pgtransport.max_clock_skew', 'off', true)`

	nowExpr = `COALESCE($1::float8, extract(epoch FROM clock_timestamp())::float8)`

	// partitionSQL reads the database's partition number (NULL: none), the
	// count it was armed for and the count it grew from (NULL: none), and
	// its hashtext of $1 (Cluster's checks).
	partitionSQL = `SELECT m.part, m.parts, m.grown_from, hashtext($1::text) FROM {s}harel_partition_map() AS m`

	// hereSQL is those of $1's groups that have anything in this
	// partition (a Cluster's locate while the cluster grows).
	hereSQL = `SELECT g FROM {s}harel_here($1::text[]) AS g`

	// leftSQL is those of $1's groups that have left this partition, as
	// its fence decides (a PublishTx's check while the cluster grows).
	leftSQL = `SELECT g FROM {s}harel_left($1::text[]) AS g`

	// publishHereSQL is publishKeyedSQL (plain with $6 NULL) that publishes
	// only the groups that may stay in this partition, each seq beside its
	// input's place $1; NULL for a group that moved (a grown cluster).
	publishHereSQL = `SELECT r.ord, r.seq FROM {s}harel_px_publish_many($1::int[], $2::text[], $3::text[], $4::int[], $5::text[], $6::float8, $7::text[]) AS r`

	// The publishes pass the tenants NULL where none is named (the
	// default tenant).
	publishSQL = `SELECT {s}harel_publish($1::text, $2::text, $3::int, $4::text)`

	// A claim commits without waiting for its WAL flush (synchronous_commit
	// off for its own transaction only). A claim lost in a crash only
	// returns its group to the queue, as a lapsed lease would: the holder's
	// ack is then fenced off, and any later commit (an ack, a publish)
	// flushes the claim's WAL first, WAL being sequential. Acks, nacks and
	// publishes stay synchronous: what they report done is durable.
	asyncCommit = `set_config('synchronous_commit', 'off', true)`

	// claimSQL claims one group with harel_claim_one (harel_claim's loop
	// past empty groups, plus the attempt and the message's age).
	claimSQL = `SELECT c.group_id, c.seq, c.event, c.attempt, c.age
  FROM (SELECT ` + nowExpr + ` AS now, ` + asyncCommit + ` AS sc{k}) AS t,
       LATERAL {s}harel_claim_one(t.now, t.now + $2::float8, $3::text, $4::int) AS c`

	// claimInTxSQL is the claim inside a caller's transaction: it leaves
	// synchronous_commit alone, which would apply to the caller's writes.
	claimInTxSQL = `SELECT c.group_id, c.seq, c.event, c.attempt, c.age
  FROM (SELECT ` + nowExpr + ` AS now{k}) AS t,
       LATERAL {s}harel_claim_one(t.now, t.now + $2::float8, $3::text, $4::int) AS c`

	ackSQL = `SELECT {s}harel_ack($2::text, $3::bigint, $4::text, ` + nowExpr + `){kfrom}`

	nackSQL = `SELECT {s}harel_nack($2::text, $3::text, ` + nowExpr + `, $4::float8){kfrom}`

	extendSQL = `SELECT {s}harel_extend($2::text, $3::text, ` + nowExpr + ` + $4::float8){kfrom}`

	// extendManySQL extends many leases to now + $5 seconds: held per
	// input, in input order.
	extendManySQL = `SELECT e.held
  FROM (SELECT ` + nowExpr + ` AS now{k}) AS t,
       LATERAL {s}harel_extend_many($2::text[], $3::bigint[], $4::text[], t.now + $5::float8) AS e`

	// failSQL answers NULL (not held), 'retry', 'dead' or 'stopped'.
	failSQL = `SELECT {s}harel_fail($2::text, $3::bigint, $4::text, ` + nowExpr + `, $5::text){kfrom}`
	// deadLetterSQL and snoozeSQL answer whether the lease held.
	deadLetterSQL = `SELECT {s}harel_dead_letter($2::text, $3::bigint, $4::text, ` + nowExpr + `, $5::text){kfrom}`
	snoozeSQL     = `SELECT {s}harel_snooze($2::text, $3::bigint, $4::text, ` + nowExpr + `, $5::float8){kfrom}`

	// releaseSQL gives an unused lease back, uncounted. It takes no now.
	releaseSQL = `SELECT {s}harel_release($1::text, $2::text)`

	// waitSQL returns now and the earliest lock_expiry after it, both by
	// the clock the claims use, so the caller times its sleep as a
	// difference and never compares its own clock with the server's.
	waitSQL = `SELECT t.now, {s}harel_wait($2::text, $3::int, $4::float8, t.now)
  FROM (SELECT ` + nowExpr + ` AS now) AS t`

	unwaitSQL = `SELECT {s}harel_unwait($1::text)`

	channelSQL = `SELECT {s}harel_channel()`

	publishManySQL = `SELECT s FROM {s}harel_publish_many($1::text[], $2::text[], $3::int[], $4::text[]) AS s`

	// publishKeyedSQL is publishManySQL with a dedup key per message (NULL:
	// none) and the window in seconds.
	publishKeyedSQL = `SELECT s FROM {s}harel_publish_keyed($1::text[], $2::text[], $3::int[], $4::text[], $5::float8, $6::text[]) AS s`

	// pendingSQL returns the places (1-based) of the (group, seq) pairs
	// whose message is still queued: a read, by primary key.
	pendingSQL = `SELECT p.i::int FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS p(g, s, i)
 WHERE EXISTS (SELECT 1 FROM {s}transport_messages AS m WHERE m.seq = p.s AND m.group_id = p.g)`

	// exchangeSQL settles ($6-$9) and claims ($3-$5) in one round-trip;
	// $10: the claim may rest ("Going round" in schema/sql/functions/30_claim.sql).
	exchangeSQL = `SELECT e.kind::text, e.group_id, e.held, e.seq, e.event, e.attempt, e.age
  FROM (SELECT ` + nowExpr + ` AS now{k}) AS t,
       LATERAL {s}harel_exchange_leases(t.now, t.now + $2::float8, $3::text, $4::int, $5::int,
                                        $6::text[], $7::bigint[], $8::text[], $9::bool[], $10::bool) AS e`

	// The dead-letter calls and the restart of a stopped group. A NULL
	// group or seq list means all.
	deadLettersSQL = `SELECT d.seq, d.group_id, d.event, d.priority, d.attempts, d.last_error, d.published_at, d.died_at
  FROM {s}harel_dead_letters($1::text, $2::bigint, $3::int) AS d`
	redriveSQL      = `SELECT {s}harel_redrive($1::text, $2::bigint[])`
	purgeSQL        = `SELECT {s}harel_purge_dead_letters($1::text, $2::bigint[])`
	restartGroupSQL = `SELECT {s}harel_restart_group($1::text, $2::bool)`

	// The operator's calls (schema version 11): reads of the queue and the
	// pause, resume and purge of one group. The ones that take now take it
	// as the claims do ($1), so a state ("leased", "parked") is judged by
	// the claims' clock.
	statsSQL = `SELECT s.priority, s.groups, s.free, s.leased, s.parked, s.stopped, s.paused,
       s.messages, s.messages_exact, s.oldest_head_age, s.oldest_head_exact,
       s.dead_letters, s.dead_letters_exact, s.waiters, s.at, s.groups_exact
  FROM (SELECT ` + nowExpr + ` AS now{k}) AS t, LATERAL {s}harel_stats(t.now) AS s`
	groupsSQL = `SELECT g.group_id, g.priority, g.state, g.holder, g.leased_at, g.until, g.head_seq, g.head_age, g.attempts, g.tenant
  FROM (SELECT ` + nowExpr + ` AS now{k}) AS t,
       LATERAL {s}harel_groups(t.now, $2::text, $3::text, $4::int, $5::int, $6::text) AS g`
	groupSQL = `SELECT g.group_id, g.priority, g.state, g.holder, g.leased_at, g.until, g.head_seq, g.head_age, g.attempts, g.tenant
  FROM (SELECT ` + nowExpr + ` AS now{k}) AS t, LATERAL {s}harel_group(t.now, $2::text) AS g`
	peekSQL       = `SELECT p.seq, p.event, p.published_at, p.last_error FROM {s}harel_peek($1::text, NULL::bigint, $2::int) AS p`
	pauseGroupSQL = `SELECT {s}harel_pause_group($1::text)`

	// The tenants' calls (schema version 27).
	setTenantWeightSQL = `SELECT {s}harel_set_tenant_weight($1::text, $2::int)`
	tenantsSQL         = `SELECT r.tenant, r.weight, r.groups, r.leased, r.ready, r.delivered
  FROM (SELECT ` + nowExpr + ` AS now{k}) AS t, LATERAL {s}harel_tenants(t.now) AS r`
	resumeGroupSQL = `SELECT {s}harel_resume_group($1::text)`
	purgeGroupSQL  = `SELECT {s}harel_purge_group($2::text, ` + nowExpr + `, $3::int){kfrom}`

	// Exactly-once (schema version 12): the ack that also writes the
	// group's state, inside the caller's transaction, and the state's read.
	ackStateSQL = `SELECT {s}harel_ack_state($2::text, $3::bigint, $4::text, ` + nowExpr + `, $5::bytea){kfrom}`
	stateSQL    = `SELECT {s}harel_state($1::text)`

	// The queue's policy: a plain read and an UPDATE of the fields given
	// (NULL keeps the stored value).
	policyGetSQL = `SELECT max_attempts, on_exhausted, backoff_min, backoff_max, state_retention FROM {s}transport_policy`
	policySetSQL = `UPDATE {s}transport_policy
   SET max_attempts = COALESCE($1::int, max_attempts),
       on_exhausted = COALESCE($2::text, on_exhausted),
       backoff_min = COALESCE($3::float8, backoff_min),
       backoff_max = COALESCE($4::float8, backoff_max),
       state_retention = COALESCE($5::float8, state_retention)`
)

// statements are the SQL texts bound to one schema.
type statements struct {
	partition, partitionTable            string
	here, left, publishHere              string
	publish, claim, ack, nack, extend    string
	extendMany, ackClaim                 string
	claimInTx, fail, release             string
	deadLetter, snooze                   string
	wait, unwait, channel                string
	publishMany, publishKeyed, exchange  string
	pending                              string
	deadLetters, redrive, purge, restart string
	policyGet, policySet                 string
	stats, groups, group, peek           string
	pause, resume, purgeGroup            string
	ackState, state                      string
	setWeight, tenants                   string
}

func newStatements(schema string, clock bool) statements {
	prefix := ""
	if schema != "" {
		prefix = pgx.Identifier{schema}.Sanitize() + "."
	}
	k, kfrom := "", ""
	if clock {
		k, kfrom = ", "+skewOff+" AS k", " FROM (SELECT "+skewOff+" AS k) AS k"
	}
	bind := strings.NewReplacer("{s}", prefix, "{kfrom}", kfrom, "{k}", k).Replace
	return statements{
		publish:   bind(publishSQL),
		claim:     bind(claimSQL),
		claimInTx: bind(claimInTxSQL),
		ack:       bind(ackSQL),
		nack:      bind(nackSQL),
		extend:    bind(extendSQL),
		wait:      bind(waitSQL),
		unwait:    bind(unwaitSQL),
		channel:   bind(channelSQL),

		extendMany: bind(extendManySQL),
		ackClaim:   bind(ackClaimSQL),
		fail:       bind(failSQL),
		deadLetter: bind(deadLetterSQL),
		snooze:     bind(snoozeSQL),
		release:    bind(releaseSQL),

		publishMany:  bind(publishManySQL),
		publishKeyed: bind(publishKeyedSQL),
		exchange:     bind(exchangeSQL),
		pending:      bind(pendingSQL),

		deadLetters: bind(deadLettersSQL),
		redrive:     bind(redriveSQL),
		purge:       bind(purgeSQL),
		restart:     bind(restartGroupSQL),
		policyGet:   bind(policyGetSQL),
		policySet:   bind(policySetSQL),

		stats:      bind(statsSQL),
		groups:     bind(groupsSQL),
		group:      bind(groupSQL),
		peek:       bind(peekSQL),
		pause:      bind(pauseGroupSQL),
		resume:     bind(resumeGroupSQL),
		purgeGroup: bind(purgeGroupSQL),

		setWeight: bind(setTenantWeightSQL),
		tenants:   bind(tenantsSQL),

		ackState: bind(ackStateSQL),
		state:    bind(stateSQL),

		partition:      bind(partitionSQL),
		partitionTable: bind("{s}transport_partition"),
		here:           bind(hereSQL),
		left:           bind(leftSQL),
		publishHere:    bind(publishHereSQL),
	}
}
