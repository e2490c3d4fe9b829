package dashboard

import (
	"github.com/pgtransport/pgtransport"
)

// sample is one reading of the queue by Run.
type sample struct {
	Stats pgtransport.Stats
	// Published counts the seqs ever handed out (harel_counters): every
	// publish takes one (a rolled-back publish too), a redrive reuses the
	// dead letter's. Summed over partitions through a proxy.
	Published int64
	// Deleted counts the rows ever deleted from the messages (acks, purges,
	// moves to the dead letters), by PostgreSQL's statistics: flushed about
	// once a second, reset by pg_stat_reset. -1: unknown.
	Deleted int64
}

// point is one point of the chart: the depth at a sample, and the rates
// since the sample before it.
type point struct {
	T          float64  `json:"t"`         // seconds since the epoch, by the server's clock
	Published  *float64 `json:"published"` // messages per second; null: unknown
	Acked      *float64 `json:"acked"`     // messages per second (purges count too); null: unknown
	Depth      int64    `json:"depth"`
	DepthExact bool     `json:"depth_exact"`
}

// points turns samples (oldest first) into the chart's points.
//
// Published is the seqs handed out per second. Acked has no counter of
// its own in the queue, so it is derived: while both depths and both dead
// letter counts are exact, every seq handed out that is neither still
// queued nor dead was acked (or purged): published - Δdepth - Δdead
// (PurgeDeadLetters makes it read low). Past the exact range (a depth or a
// dead letter count estimated), it is the rows deleted from the messages
// less the new dead letters, by the statistics counter (lags about a
// second). A negative figure (a race between the reads, a counter reset)
// shows as 0 or unknown, never as a negative rate.
func points(samples []sample) []point {
	out := make([]point, 0, len(samples))
	for i, cur := range samples {
		p := point{
			T:          float64(cur.Stats.At.UnixMilli()) / 1000,
			Depth:      cur.Stats.Total.Messages,
			DepthExact: cur.Stats.Total.MessagesExact,
		}
		if i > 0 {
			p.Published, p.Acked = rates(samples[i-1], cur)
		}
		out = append(out, p)
	}
	return out
}

// rates is published and acked per second from prev to cur.
func rates(prev, cur sample) (published, acked *float64) {
	dt := cur.Stats.At.Sub(prev.Stats.At).Seconds()
	if dt <= 0 {
		return nil, nil
	}
	pub := cur.Published - prev.Published
	if pub < 0 {
		return nil, nil
	}
	p, c := prev.Stats.Total, cur.Stats.Total
	deadExact := p.DeadLettersExact && c.DeadLettersExact
	var dead int64
	if deadExact {
		dead = c.DeadLetters - p.DeadLetters
	}
	var done int64
	switch {
	case p.MessagesExact && c.MessagesExact && deadExact:
		done = pub - (c.Messages - p.Messages) - dead
	case prev.Deleted >= 0 && cur.Deleted >= prev.Deleted:
		done = cur.Deleted - prev.Deleted - max(dead, 0)
	default:
		return perSecond(pub, dt), nil
	}
	return perSecond(pub, dt), perSecond(max(done, 0), dt)
}

func perSecond(n int64, dt float64) *float64 {
	r := float64(n) / dt
	return &r
}
