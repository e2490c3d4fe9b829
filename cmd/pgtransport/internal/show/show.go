// Package show holds what the command's text and JSON output and the
// dashboard show alike: the JSON form of the queue's stats, and a clipped
// one-line rendering of free text.
package show

import (
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/pgtransport/pgtransport"
)

// PriorityStats is pgtransport.PriorityStats as JSON: durations in
// seconds, the total's priority null.
type PriorityStats struct {
	Priority         *int    `json:"priority"` // null for the total
	Groups           int64   `json:"groups"`
	GroupsExact      bool    `json:"groups_exact"`
	Free             int64   `json:"free"`
	Leased           int64   `json:"leased"`
	Parked           int64   `json:"parked"`
	Stopped          int64   `json:"stopped"`
	Paused           int64   `json:"paused"`
	Messages         int64   `json:"messages"`
	MessagesExact    bool    `json:"messages_exact"`
	OldestHeadAge    float64 `json:"oldest_head_age_seconds"`
	OldestHeadExact  bool    `json:"oldest_head_exact"`
	DeadLetters      int64   `json:"dead_letters"`
	DeadLettersExact bool    `json:"dead_letters_exact"`
}

// Priority is p's JSON form.
func Priority(p pgtransport.PriorityStats) PriorityStats {
	out := PriorityStats{
		Groups: p.Groups, GroupsExact: p.GroupsExact, Free: p.Free, Leased: p.Leased, Parked: p.Parked,
		Stopped: p.Stopped, Paused: p.Paused, Messages: p.Messages, MessagesExact: p.MessagesExact,
		OldestHeadAge: p.OldestHeadAge.Seconds(), OldestHeadExact: p.OldestHeadExact,
		DeadLetters: p.DeadLetters, DeadLettersExact: p.DeadLettersExact,
	}
	if p.Priority >= 0 {
		out.Priority = &p.Priority
	}
	return out
}

// Clip makes s one short line (a table cell): control characters and runs
// of spaces as one space, cut to max runes with an ellipsis.
func Clip(s string, max int) string {
	var b strings.Builder
	n, space := 0, false
	for _, r := range s {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			if space {
				continue
			}
			r, space = ' ', true
		} else {
			space = false
		}
		if n == max {
			return strings.TrimRight(b.String(), " ") + "…"
		}
		b.WriteRune(r)
		n++
	}
	return strings.TrimSpace(b.String())
}

// Age formats a duration for a table: whole seconds under a minute, then
// two units ("3m04s", "2h05m", "3d04h"); "-" for zero or less. The
// dashboard's script formats ages the same way.
func Age(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	s := int64(d.Round(time.Second) / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	case s < 86400:
		return fmt.Sprintf("%dh%02dm", s/3600, s%3600/60)
	default:
		return fmt.Sprintf("%dd%02dh", s/86400, s%86400/3600)
	}
}
