// Package core is the one implementation behind package sync and package
// async: argument checks, the statements, error mapping, and the
// publish/claim/ack/nack/extend calls. Front-ends add only their calling
// convention.
package core

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/schema"
)

// DBTX is what the core sends statements through: a *pgxpool.Pool, a
// *pgx.Conn or a pgx.Tx. A *pgx.Conn serves one goroutine at a time.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Core is safe for concurrent use when its DBTX is.
type Core struct {
	db       DBTX
	clock    func() time.Time
	maxEvent int
	q        statements
	cfg      pgtransport.Config
	parking  Parking // this core's idle callers; see wake.go for who wakes them
}

// New checks cfg, fills its defaults and, unless cfg.SkipApply, applies the
// schema.
func New(ctx context.Context, db DBTX, cfg pgtransport.Config) (*Core, error) {
	cfg, err := Defaults(cfg)
	if err != nil {
		return nil, err
	}
	if isNil(db) {
		return nil, fmt.Errorf("%w: nil database handle", pgtransport.ErrInvalidConfig)
	}
	if !cfg.SkipApply {
		if err := schema.Apply(ctx, db, cfg.Schema); err != nil {
			return nil, mapErr("apply schema", err)
		}
	}
	q := newStatements(cfg.Schema, cfg.Clock != nil)
	if _, inTx := db.(pgx.Tx); inTx {
		q.claim = q.claimInTx // a caller's transaction keeps its own commit mode
	}
	return &Core{db: db, clock: cfg.Clock, maxEvent: cfg.MaxEventBytes, q: q, cfg: cfg}, nil
}

// Defaults validates cfg and fills in the defaults its zero fields stand for.
func Defaults(cfg pgtransport.Config) (pgtransport.Config, error) {
	if err := schema.ValidateName(cfg.Schema); err != nil {
		return cfg, err
	}
	if cfg.MaxEventBytes < 0 || cfg.MaxConnectWait < 0 || cfg.IdleSweep < 0 {
		return cfg, fmt.Errorf("%w: MaxEventBytes, MaxConnectWait and IdleSweep must not be negative", pgtransport.ErrInvalidConfig)
	}
	if cfg.Vacuum < 0 {
		return cfg, fmt.Errorf("%w: Vacuum must not be negative", pgtransport.ErrInvalidConfig)
	}
	if cfg.MaxKeep < -1 {
		return cfg, fmt.Errorf("%w: MaxKeep %d, want -1 (never keep), 0 (default) or more", pgtransport.ErrInvalidConfig, cfg.MaxKeep)
	}
	cfg.MaxEventBytes = cmp.Or(cfg.MaxEventBytes, pgtransport.DefaultMaxEventBytes)
	cfg.MaxConnectWait = cmp.Or(cfg.MaxConnectWait, pgtransport.DefaultMaxConnectWait)
	cfg.IdleSweep = cmp.Or(cfg.IdleSweep, pgtransport.DefaultIdleSweep)
	cfg.MaxKeep = cmp.Or(cfg.MaxKeep, pgtransport.DefaultMaxKeep)
	return cfg, nil
}

// Config returns the configuration with defaults filled in.
func (c *Core) Config() pgtransport.Config { return c.cfg }

// now is the injected clock's time as epoch seconds, or nil: the server's.
func (c *Core) now() *float64 {
	if c.clock == nil {
		return nil
	}
	s := epoch(c.clock())
	return &s
}

func epoch(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// Publish appends event to group, readying the group with priority if it
// is new, and wakes one parked caller.
func (c *Core) Publish(ctx context.Context, group, event string, priority int) (int64, error) {
	seq, err := c.publish(ctx, c.db, group, event, priority)
	c.parking.Wake(wakesPublish(1, err))
	return seq, err
}

// PublishTx is Publish inside the caller's transaction tx. It wakes nobody:
// the message is invisible until the caller commits, which the core does
// not see (async streams learn of it by notification, ClaimWait callers
// at their next look).
func (c *Core) PublishTx(ctx context.Context, tx pgx.Tx, group, event string, priority int) (int64, error) {
	if tx == nil {
		return 0, fmt.Errorf("publish: %w: nil transaction", pgtransport.ErrInvalidConfig)
	}
	return c.publish(ctx, tx, group, event, priority)
}

// publish appends event to group through db: the core's handle or a
// caller's transaction.
func (c *Core) publish(ctx context.Context, db DBTX, group, event string, priority int) (int64, error) {
	if err := cmp.Or(checkGroup(group), c.checkEvent(event), checkPriority(priority)); err != nil {
		return 0, fmt.Errorf("publish: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("publish: %w", err)
	}
	var seq int64
	if err := db.QueryRow(ctx, c.q.publish, group, event, priority).Scan(&seq); err != nil {
		return 0, mapErr("publish", err)
	}
	return seq, nil
}

// Claim leases the next claimable group at or above minPriority and returns
// its head, or nil when nothing is claimable.
func (c *Core) Claim(ctx context.Context, workerID string, visibility time.Duration, minPriority int) (*pgtransport.Lease, error) {
	if err := CheckClaim(workerID, visibility, minPriority); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	token := NewToken(workerID)
	l := pgtransport.Lease{Token: token}
	sent := time.Now()
	err := c.db.QueryRow(ctx, c.q.claim, c.now(), visibility.Seconds(), token, minPriority).
		Scan(&l.Group, &l.Seq, &l.Event, nil) // nil: the lease end by the server's clock, see localExpiry
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, mapErr("claim", err)
	}
	l.Expiry = localExpiry(sent, visibility)
	return &l, nil
}

// localExpiry is Lease.Expiry for a lease of visibility asked for at sent,
// by this process's clock. The server ends the lease visibility after the
// statement reaches it, which is after sent: so this is never later than
// the real end, however far the server's clock is from this one.
func localExpiry(sent time.Time, visibility time.Duration) time.Time {
	return sent.Add(visibility)
}

// Ack deletes the lease's message and frees its group, waking one parked
// caller.
func (c *Core) Ack(ctx context.Context, l *pgtransport.Lease) error {
	if err := checkLease(l); err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	err := c.fenced(ctx, "ack", c.q.ack, l.Group, l.Seq, l.Token)
	c.parking.Wake(wakesSettle(err))
	return err
}

// Nack gives the lease back: parked for delay, or free at once when delay
// is 0. Either way it wakes one parked caller.
func (c *Core) Nack(ctx context.Context, l *pgtransport.Lease, delay time.Duration) error {
	if err := cmp.Or(checkLease(l), checkDelay(delay)); err != nil {
		return fmt.Errorf("nack: %w", err)
	}
	err := c.fenced(ctx, "nack", c.q.nack, l.Group, l.Token, delay.Seconds())
	c.parking.Wake(wakesSettle(err))
	return err
}

// Extend moves the lease's end to now + visibility.
func (c *Core) Extend(ctx context.Context, l *pgtransport.Lease, visibility time.Duration) error {
	if err := cmp.Or(checkLease(l), checkVisibility(visibility)); err != nil {
		return fmt.Errorf("extend: %w", err)
	}
	return c.fenced(ctx, "extend", c.q.extend, l.Group, l.Token, visibility.Seconds())
}

// Wait records waiter (unless "") as idle, wanting a notification for any
// new group at or above minPriority, for ttl, and returns how long from now until the
// earliest lease or park among such groups runs out (ok false: none does).
func (c *Core) Wait(ctx context.Context, waiter string, minPriority int, ttl time.Duration) (next time.Duration, ok bool, err error) {
	var (
		now    float64
		expiry *float64
		who    *string
	)
	if waiter != "" {
		who = &waiter
	}
	if err := c.db.QueryRow(ctx, c.q.wait, c.now(), who, minPriority, ttl.Seconds()).Scan(&now, &expiry); err != nil {
		return 0, false, mapErr("wait", err)
	}
	if expiry == nil {
		return 0, false, nil
	}
	return time.Duration((*expiry - now) * float64(time.Second)), true, nil
}

// Unwait withdraws waiter's wish to be notified.
func (c *Core) Unwait(ctx context.Context, waiter string) error {
	if _, err := c.db.Exec(ctx, c.q.unwait, waiter); err != nil {
		return mapErr("unwait", err)
	}
	return nil
}

// Channel returns the NOTIFY channel of the schema's queue.
func (c *Core) Channel(ctx context.Context) (string, error) {
	var ch string
	if err := c.db.QueryRow(ctx, c.q.channel).Scan(&ch); err != nil {
		return "", mapErr("channel", err)
	}
	return ch, nil
}

// NewToken returns a fresh lease token for workerID.
func NewToken(workerID string) string { return workerID + ":" + newUUID() }

// fenced runs a statement that answers whether the token still held its
// group: false is ErrLeaseLost.
func (c *Core) fenced(ctx context.Context, op, sql string, args ...any) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	var held bool
	if err := c.db.QueryRow(ctx, sql, append([]any{c.now()}, args...)...).Scan(&held); err != nil {
		return mapErr(op, err)
	}
	if !held {
		return fmt.Errorf("%s: %w", op, pgtransport.ErrLeaseLost)
	}
	return nil
}

// mapErr maps PostgreSQL error codes to the package's sentinels, keeping the
// original error in the chain.
func mapErr(op string, err error) error {
	if errors.Is(err, puddle.ErrClosedPool) {
		// The pool under the transport was closed (by the transport's
		// Close, or by its owner): the call never reached the server.
		return fmt.Errorf("%s: %w: %w", op, pgtransport.ErrClosed, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42883", "42P01", "3F000": // undefined_function, undefined_table, invalid_schema_name
			return fmt.Errorf("%s: %w: %w", op, pgtransport.ErrSchemaMissing, err)
		case "23514": // check_violation: the group-id rule (009_hardening.sql) or the priority CHECK
			if pgErr.ConstraintName == groupIDConstraint {
				return fmt.Errorf("%s: %w: %w", op, pgtransport.ErrInvalidGroup, err)
			}
			return fmt.Errorf("%s: %w: %w", op, pgtransport.ErrInvalidPriority, err)
		}
		if sentinel := refusals[pgErr.Code]; sentinel != nil {
			return fmt.Errorf("%s: %w: %w", op, sentinel, err)
		}
	}
	if pgErr == nil && mayHaveApplied(err) { // see outcome.go
		return fmt.Errorf("%s: %w: %w", op, pgtransport.ErrOutcomeUnknown, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// groupIDConstraint is the CHECK that holds every message's group id to
// the rule checkGroup applies (schema/sql/009_hardening.sql).
const groupIDConstraint = "transport_messages_group_id_valid"

// refusals maps the functions' own SQLSTATEs (class PT, see "Entry
// checks" in schema/sql/functions.sql) to sentinels. The Go calls check
// their arguments first, so most of these reach a Go caller only through
// a hand-made Lease or a caller's own settings.
var refusals = map[string]error{
	"PT002": pgtransport.ErrInvalidWorkerID,   // a NULL or empty lease token (workerID:uuid in Go)
	"PT003": pgtransport.ErrInvalidVisibility, // a lease or park end that is NULL or not after now
	"PT004": pgtransport.ErrInvalidDelay,      // a NULL or negative nack delay
	"PT005": pgtransport.ErrClockSkew,         // now too far from the server's clock
}

// isNil reports whether db is nil, or an interface holding a nil pointer
// (a nil *pgxpool.Pool), which would otherwise panic on first use.
func isNil(db any) bool {
	if db == nil {
		return true
	}
	v := reflect.ValueOf(db)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Parking returns the queue where this core's idle callers wait: an async
// stream parks its ticket there and, for its own round-trips, wakes as many
// as Freed counts.
func (c *Core) Parking() *Parking { return &c.parking }
