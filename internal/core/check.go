package core

import (
	"cmp"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgtransport/pgtransport"
)

// The argument checks, in one place. Each returns a typed error before
// anything reaches the database.

func checkText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// checkID checks a group id or worker id: non-empty, at most limit bytes,
// valid UTF-8 without NUL.
func checkID(id string, limit int, sentinel error) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty", sentinel)
	case len(id) > limit:
		return fmt.Errorf("%w: %d bytes, the limit is %d", sentinel, len(id), limit)
	case !checkText(id):
		return fmt.Errorf("%w: not valid UTF-8 or holds a NUL byte", sentinel)
	}
	return nil
}

func checkGroup(group string) error {
	return checkID(group, pgtransport.MaxGroupBytes, pgtransport.ErrInvalidGroup)
}

func checkWorkerID(id string) error {
	return checkID(id, pgtransport.MaxWorkerIDBytes, pgtransport.ErrInvalidWorkerID)
}

func (c *Core) checkEvent(event string) error {
	switch {
	case len(event) > c.maxEvent:
		return fmt.Errorf("%w: %d bytes, the limit is %d", pgtransport.ErrEventTooLarge, len(event), c.maxEvent)
	case !checkText(event):
		return fmt.Errorf("%w: not valid UTF-8 or holds a NUL byte", pgtransport.ErrInvalidEvent)
	}
	return nil
}

func checkPriority(p int) error {
	if p < pgtransport.MinPriority || p > pgtransport.MaxPriority {
		return fmt.Errorf("%w: %d, want %d to %d", pgtransport.ErrInvalidPriority, p, pgtransport.MinPriority, pgtransport.MaxPriority)
	}
	return nil
}

func checkVisibility(d time.Duration) error {
	if d < pgtransport.MinVisibility {
		return fmt.Errorf("%w: %v, want at least %v", pgtransport.ErrInvalidVisibility, d, pgtransport.MinVisibility)
	}
	return nil
}

func checkDelay(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("%w: %v, want >= 0", pgtransport.ErrInvalidDelay, d)
	}
	return nil
}

// checkLease checks a lease to settle. Not by the publish-side group rule
// (checkGroup): a lease the database issued is always settled, even one of
// a group published before the schema enforced that rule (version 9) or
// by a client that ignored it, else such a group would stay blocked. Only
// a group id no database can issue is refused, as a lease that does not
// exist: PostgreSQL text never holds a NUL byte. (Invalid UTF-8 is left
// to the server: a SQL_ASCII database can hold it.)
func checkLease(l *pgtransport.Lease) error {
	if l == nil {
		return pgtransport.ErrNilLease
	}
	if strings.ContainsRune(l.Group, 0) {
		return fmt.Errorf("%w: a group id with a NUL byte, which no database holds", pgtransport.ErrLeaseLost)
	}
	if l.Token == "" || !checkText(l.Token) {
		return fmt.Errorf("%w: lease has no valid token", pgtransport.ErrLeaseLost)
	}
	return nil
}

// CheckClaim checks a claim's arguments.
func CheckClaim(workerID string, visibility time.Duration, minPriority int) error {
	return cmp.Or(checkWorkerID(workerID), checkVisibility(visibility), checkPriority(minPriority))
}

// checkDedupKey checks a Message.DedupKey: "" (no key) or at most
// MaxDedupKeyBytes of valid UTF-8 without NUL.
func checkDedupKey(key string) error {
	switch {
	case len(key) > pgtransport.MaxDedupKeyBytes:
		return fmt.Errorf("%w: %d bytes, the limit is %d", pgtransport.ErrInvalidDedupKey, len(key), pgtransport.MaxDedupKeyBytes)
	case !checkText(key):
		return fmt.Errorf("%w: not valid UTF-8 or holds a NUL byte", pgtransport.ErrInvalidDedupKey)
	}
	return nil
}

// CheckTenant checks a tenant id; "" is refused where empty is false
// (a message's "" is DefaultTenant).
func CheckTenant(tenant string, empty bool) error {
	switch {
	case tenant == "" && !empty:
		return fmt.Errorf("%w: empty", pgtransport.ErrInvalidTenant)
	case len(tenant) > pgtransport.MaxTenantBytes:
		return fmt.Errorf("%w: %d bytes, the limit is %d", pgtransport.ErrInvalidTenant, len(tenant), pgtransport.MaxTenantBytes)
	case !checkText(tenant):
		return fmt.Errorf("%w: not valid UTF-8 or holds a NUL byte", pgtransport.ErrInvalidTenant)
	}
	return nil
}

// CheckWeight checks a tenant weight.
func CheckWeight(weight int) error {
	if weight < 1 || weight > pgtransport.MaxTenantWeight {
		return fmt.Errorf("%w: %d, want 1 to %d", pgtransport.ErrInvalidWeight, weight, pgtransport.MaxTenantWeight)
	}
	return nil
}

// checkMessage checks a message to publish.
func (c *Core) checkMessage(m pgtransport.Message) error {
	return cmp.Or(checkGroup(m.Group), c.checkEvent(m.Event), checkPriority(m.Priority), checkDedupKey(m.DedupKey),
		CheckTenant(m.Tenant, true))
}

// tenantArg is a message's tenant as a publish passes it: NULL for ""
// (DefaultTenant).
func tenantArg(tenant string) *string {
	if tenant == "" {
		return nil
	}
	return &tenant
}

// checkStoredGroup checks a group id that names groups or dead letters
// already stored. As checkLease, not by the publish-side rule (a group
// published before the schema enforced it must stay reachable): only an
// id no database holds is refused, and "".
func checkStoredGroup(group string) error {
	switch {
	case group == "":
		return fmt.Errorf("%w: empty", pgtransport.ErrInvalidGroup)
	case strings.ContainsRune(group, 0):
		return fmt.Errorf("%w: holds a NUL byte, which no database holds", pgtransport.ErrInvalidGroup)
	}
	return nil
}

// CauseText is the text Fail records for cause: its Error() ("" for nil),
// made valid UTF-8 (each invalid byte sequence becomes U+FFFD), without
// NUL bytes, and cut to at most MaxErrorBytes at a rune boundary, so the
// database always accepts it and a long cause costs a bounded write.
func CauseText(cause error) string {
	if cause == nil {
		return ""
	}
	s := strings.ToValidUTF8(cause.Error(), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) <= pgtransport.MaxErrorBytes {
		return s
	}
	cut := pgtransport.MaxErrorBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// CheckMessage is the check a publish of m makes before it sends anything
// (a Cluster's, before it checks the caller's transaction).
func (c *Core) CheckMessage(m pgtransport.Message) error { return c.checkMessage(m) }

// CheckLease is the check a settle of l makes before it sends anything.
func CheckLease(l *pgtransport.Lease) error { return checkLease(l) }

// CheckGroup is the check a read of group's state makes before it sends
// anything.
func CheckGroup(group string) error { return checkGroup(group) }
