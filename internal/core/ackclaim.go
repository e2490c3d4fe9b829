package core

import (
	"context"
	"fmt"
	"time"

	"github.com/pgtransport/pgtransport"
)

// ackClaimSQL settles a lease ($2-$4, kept if $5 allows) and takes the
// slot's next lease (claimed for $7) in one statement: harel_ack_claim.
const ackClaimSQL = `SELECT a.held, a.kept, a.group_id, a.seq, a.event, a.attempt, a.age
  FROM (SELECT ` + nowExpr + ` AS now{k}) AS t,
       LATERAL {s}harel_ack_claim($2::text, $3::bigint, $4::text, $5::bool,
                                  t.now, t.now + $6::float8, $7::text, $8::int) AS a`

// AckClaim acks l and takes the slot's next lease in one round-trip and
// one transaction: l's group kept under the same lease for its next
// message when it has one and l may keep it (keepFor, as AckNext),
// else the next claimable group for workerID. It is the blocking
// runtime's step between two messages: a message costs one round-trip and
// one commit, and no more server work than the ack and the claim it
// replaces (the batch Exchange costs more for a single lease). ackErr is
// the ack's: ErrLeaseLost when l was lost (a claim is made anyway). next
// is nil when nothing was claimable.
func (c *Core) AckClaim(ctx context.Context, l *pgtransport.Lease, workerID string, visibility time.Duration, minPriority int) (next *pgtransport.Lease, ackErr, err error) {
	if err := checkLease(l); err != nil {
		return nil, nil, fmt.Errorf("ack: %w", err)
	}
	if err := CheckClaim(workerID, visibility, minPriority); err != nil {
		return nil, nil, fmt.Errorf("claim: %w", err)
	}
	t0 := c.timer()
	token := NewToken(workerID)
	db, done, err := c.conn(ctx)
	if err != nil {
		err = mapErr("ack", err)
		if c.Observing() {
			c.observeAcked(t0, 1, err)
		}
		return nil, nil, err
	}
	defer done()
	sent := time.Now()
	var (
		held, kept bool
		group      *string
		seq        *int64
		event      *string
		attempt    *int
		age        *float64
	)
	err = db.QueryRow(ctx, c.q.ackClaim, c.now(), l.Group, l.Seq, l.Token, c.keepFor(l), visibility.Seconds(), token, minPriority).
		Scan(&held, &kept, &group, &seq, &event, &attempt, &age)
	if err != nil {
		err = mapErr("ack", err)
		if c.Observing() {
			c.observeAcked(t0, 1, err)
		}
		return nil, nil, err
	}
	if !held {
		ackErr = fmt.Errorf("ack: %w", pgtransport.ErrLeaseLost)
		c.LeaseLost("ack", l)
	}
	switch {
	case kept:
		k := *l
		k.Seq, k.Event, k.Expiry, k.Kept = *seq, *event, localExpiry(sent, visibility), l.Kept+1
		k.Attempt, k.PublishedAt = deref(attempt), localPublished(sent, age)
		next = &k
	case group != nil:
		next = &pgtransport.Lease{Group: *group, Seq: *seq, Event: *event, Token: token,
			Expiry: localExpiry(sent, visibility), Attempt: deref(attempt), PublishedAt: localPublished(sent, age)}
	}
	if c.Observing() {
		c.observeAcked(t0, 1, ackErr)
		n := 0 // a kept lease is a hand-out too: its group's next message
		if next != nil {
			n = 1
		}
		c.observeClaimed(t0, n, nil)
	}
	if !kept {
		c.parking.Wake(wakesSettle(ackErr)) // it freed a group (its own claim took one: wake others)
	}
	return next, ackErr, nil
}
