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
	// (pgtransport.max_clock_skew, see schema/sql/functions.sql) off for
	// the statement's transaction. Only a core with Config.Clock sends it:
	// its now is a test's, not the server's. Evaluated before the function
	// call (a volatile column of a subquery the call reads from). Inside a
	// caller's transaction it lasts until that transaction ends.
	skewOff = `set_config('pgtransport.max_clock_skew', 'off', true)`

	nowExpr = `COALESCE($1::float8, extract(epoch FROM clock_timestamp())::float8)`

	publishSQL = `SELECT {s}harel_publish($1::text, $2::text, $3::int)`

	// A claim commits without waiting for its WAL flush (synchronous_commit
	// off for its own transaction only). A claim lost in a crash only
	// returns its group to the queue, as a lapsed lease would: the holder's
	// ack is then fenced off, and any later commit (an ack, a publish)
	// flushes the claim's WAL first, WAL being sequential. Acks, nacks and
	// publishes stay synchronous: what they report done is durable.
	asyncCommit = `set_config('synchronous_commit', 'off', true)`

	claimSQL = `SELECT c.group_id, c.seq, c.event, t.now + $2::float8
  FROM (SELECT ` + nowExpr + ` AS now, ` + asyncCommit + ` AS sc{k}) AS t,
       LATERAL {s}harel_claim(t.now, t.now + $2::float8, $3::text, $4::int) AS c`

	// claimInTxSQL is the claim inside a caller's transaction: it leaves
	// synchronous_commit alone, which would apply to the caller's writes.
	claimInTxSQL = `SELECT c.group_id, c.seq, c.event, t.now + $2::float8
  FROM (SELECT ` + nowExpr + ` AS now{k}) AS t,
       LATERAL {s}harel_claim(t.now, t.now + $2::float8, $3::text, $4::int) AS c`

	ackSQL = `SELECT {s}harel_ack($2::text, $3::bigint, $4::text, ` + nowExpr + `){kfrom}`

	nackSQL = `SELECT {s}harel_nack($2::text, $3::text, ` + nowExpr + `, $4::float8){kfrom}`

	extendSQL = `SELECT {s}harel_extend($2::text, $3::text, ` + nowExpr + ` + $4::float8){kfrom}`

	// waitSQL returns now and the earliest lock_expiry after it, both by
	// the clock the claims use, so the caller times its sleep as a
	// difference and never compares its own clock with the server's.
	waitSQL = `SELECT t.now, {s}harel_wait($2::text, $3::int, $4::float8, t.now)
  FROM (SELECT ` + nowExpr + ` AS now) AS t`

	unwaitSQL = `SELECT {s}harel_unwait($1::text)`

	channelSQL = `SELECT {s}harel_channel()`

	publishManySQL = `SELECT s FROM {s}harel_publish_many($1::text[], $2::text[], $3::int[]) AS s`

	claimManySQL = `SELECT c.group_id, c.seq, c.event, t.now + $2::float8
  FROM (SELECT ` + nowExpr + ` AS now{k}) AS t,
       LATERAL {s}harel_claim_many(t.now, t.now + $2::float8, $3::text, $4::int, $5::int) AS c`

	// pendingSQL returns the places (1-based) of the (group, seq) pairs
	// whose message is still queued: a read, by primary key.
	pendingSQL = `SELECT p.i::int FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS p(g, s, i)
 WHERE EXISTS (SELECT 1 FROM {s}transport_messages AS m WHERE m.seq = p.s AND m.group_id = p.g)`

	// exchangeSQL settles ($6-$9) and claims ($3-$5) in one round-trip.
	exchangeSQL = `SELECT e.kind::text, e.group_id, e.held, e.seq, e.event, t.now + $2::float8
  FROM (SELECT ` + nowExpr + ` AS now{k}) AS t,
       LATERAL {s}harel_exchange(t.now, t.now + $2::float8, $3::text, $4::int, $5::int,
                                 $6::text[], $7::bigint[], $8::text[], $9::bool[]) AS e`
)

// statements are the SQL texts bound to one schema.
type statements struct {
	publish, claim, ack, nack, extend string
	claimInTx                         string
	wait, unwait, channel             string
	publishMany, claimMany, exchange  string
	pending                           string
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

		publishMany: bind(publishManySQL),
		claimMany:   bind(claimManySQL),
		exchange:    bind(exchangeSQL),
		pending:     bind(pendingSQL),
	}
}
