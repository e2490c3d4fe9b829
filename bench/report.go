package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/pgtransport/pgtransport"
)

func (res result) median() float64 { return median(res.runs) }

// cpuFigure is the median CPU cost per message, or "-" where unknown for
// some run.
func (res result) cpuFigure() string {
	if len(res.cpu) == 0 || len(res.cpu) != len(res.runs) {
		return "-"
	}
	return strconv.FormatFloat(median(res.cpu), 'f', 0, 64)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func (res result) spread() (lo, hi float64) { return slices.Min(res.runs), slices.Max(res.runs) }

func (r *runner) find(suite, system, variant string, workers, groups int) (result, bool) {
	for _, res := range r.results {
		if res.suite == suite && res.system == system && res.variant == variant && res.workers == workers && res.groups == groups {
			return res, true
		}
	}
	return result{}, false
}

// num formats with thousands separators (and one decimal below 100).
func num(v float64) string {
	if v < 100 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// count formats an integer with thousands separators.
func count(n int) string {
	if n < 1000 {
		return strconv.Itoa(n)
	}
	return num(float64(n))
}

func figure(res result) string {
	lo, hi := res.spread()
	return fmt.Sprintf("%s (%s-%s)", num(res.median()), num(lo), num(hi))
}

func ratio(a result, b result, ok bool) string {
	if !ok || b.median() == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a.median()/b.median())
}

// table renders every figure as Markdown: medians with min-max, and for
// throughput its ratio to River (same workers) and to the baseline (same
// workers and groups).
func (r *runner) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nMedians of %d runs (min-max in brackets).\n", r.s.runs)
	if r.has("claimack") {
		b.WriteString("\n### Claim+ack throughput (msgs/s; River: jobs/s)\n\n")
		b.WriteString("River has no per-group order and no one-holder-per-group: it is the queue users would pick instead, not the same contract.\n\n")
		b.WriteString("CPU: the whole machine's busy time (client, server, kernel) per message, in microseconds; 2 cores give 2,000,000 a second, so a run with CPU x msgs/s near that is CPU-bound.\n\n")
		b.WriteString("HOT: the share of the runs' group-row updates that were HOT (written in place, no index entry; pg_stat_user_tables).\n\n")
		b.WriteString("| system | workers | groups | msgs/s | CPU µs/msg | HOT | vs River | vs baseline |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, res := range r.results {
			if res.suite != "claimack" {
				continue
			}
			groups := count(res.groups)
			if res.system == "river" {
				groups = "n/a"
			}
			river, rok := r.find("claimack", "river", "", res.workers, 0)
			base, bok := r.find("claimack", "baseline", "", res.workers, res.groups)
			fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", res.system, res.workers, groups, figure(res), res.cpuFigure(), res.hotFigure(),
				ratio(res, river, rok && res.system != "river"), ratio(res, base, bok && res.system != "baseline" && res.system != "river"))
		}
		b.WriteString("\nbaseline: the design this project replaced, every claim serialized behind one global pg_advisory_xact_lock.\n")
	}
	if r.has("commits") {
		c, _ := r.find("commits", "postgres", "", 16, 0)
		fmt.Fprintf(&b, "\n### The server's commit rate\n\n16 clients, single-row insert transactions: %s commits/s (CPU %s µs per commit). A blocking claim+ack is two commits per message: its ceiling is %s msgs/s.\n", figure(c), c.cpuFigure(), num(c.median()/2))
		if s, ok := r.find("claimack", "sync", "", 16, 10_000); ok {
			fmt.Fprintf(&b, "sync, 16 workers, 10,000 groups: %s msgs/s = %.0f%% of that ceiling.\n", num(s.median()), 100*s.median()/(c.median()/2))
		}
	}
	if r.has("runtime") {
		b.WriteString(runtimeTable(r))
	}
	if r.has("worktx") {
		b.WriteString(workTxTable(r))
	}
	if r.has("proxy") {
		b.WriteString(proxyTable(r))
	}
	if r.has("partitions") {
		b.WriteString(partitionsTable(r))
	}
	if r.has("hotgroup") {
		b.WriteString("\n### One hot group (msgs/s): 64 workers against 1\n\n| system | workers | msgs/s | vs 1 worker |\n| --- | ---: | ---: | ---: |\n")
		for _, res := range r.results {
			if res.suite == "hotgroup" {
				one, ok := r.find("hotgroup", res.system, "", 1, 1)
				fmt.Fprintf(&b, "| %s | %d | %s | %s |\n", res.system, res.workers, figure(res), ratio(res, one, ok))
			}
		}
		b.WriteString("\nsync-keep: ClaimWait + AckNext (keeps the group up to MaxKeep = 16 in a row). async: one stream, MaxInFlight = workers.\n")
	}
	if r.has("publish") {
		b.WriteString("\n### Publish throughput (each message to a new group)\n\n")
		b.WriteString("batch 1: Publish, while one async consumer works through a backlog; notifications on is the default (a busy consumer asks for none). batch 1000: PublishMany alone; notifications on means a consumer waits the whole time, so every batch sends one.\n\n")
		b.WriteString("| publishers | batch | notifications | msgs/s | vs off |\n| ---: | ---: | --- | ---: | ---: |\n")
		for _, res := range r.results {
			if res.suite == "publish" {
				batch, notify, _ := strings.Cut(res.variant, " ")
				off, ok := r.find("publish", res.system, batch+" notify=off", res.workers, 0)
				fmt.Fprintf(&b, "| %d | %s | %s | %s | %s |\n", res.workers, strings.TrimPrefix(batch, "batch="), strings.TrimPrefix(notify, "notify="), figure(res), ratio(res, off, ok))
			}
		}
	}
	if r.has("jobs") {
		b.WriteString("\n### Jobs: one group per job, publishers beside a busy consumer\n\n")
		fmt.Fprintf(&b, "Every job its own group, a %s handler, %d in flight on one async stream, a producer holding the queue at %s jobs with PublishMany batches of %d. Advisory waits: the share of this process's active backends that pg_stat_activity, sampled every %s, shows waiting on Lock:advisory (the lost-publish guard).\n\n",
			jobsHandler, jobsInFlight, count(jobsDepth), jobsBatch, jobsSampling)
		rate, _ := r.find("jobs", "async", "", jobsInFlight, 0)
		wait, _ := r.find("jobs", "async", "advisory-wait", jobsInFlight, 0)
		b.WriteString("| jobs/s | advisory waits (% of active backends) |\n| ---: | ---: |\n")
		fmt.Fprintf(&b, "| %s | %s |\n", figure(rate), figure(wait))
	}
	if r.has("claimcost") {
		b.WriteString("\n### Claim cost as groups grow (median claim+ack latency, one worker, ms)\n\n")
		b.WriteString("| groups | ms | vs 1,000 groups |\n| ---: | ---: | ---: |\n")
		first, ok := r.find("claimcost", "sync", "", 1, 1_000)
		for _, res := range r.results {
			if res.suite == "claimcost" {
				fmt.Fprintf(&b, "| %s | %s | %s |\n", count(res.groups), figure(res), ratio(res, first, ok))
			}
		}
	}
	if r.has("claimwalk") {
		b.WriteString("\n### A claim among 1,000,000 group rows, 99% leased or waiting out a backoff (one claim, rolled back)\n\n")
		b.WriteString("rows/taken: group rows fetched through an index per group the claim took (pg_stat_xact_user_tables.idx_tup_fetch).\n\n")
		b.WriteString("| claim of | ms | buffers | rows/taken |\n| ---: | ---: | ---: | ---: |\n")
		for _, limit := range []int{1, 64} {
			ms, _ := r.find("claimwalk", "sync", "ms", limit, 1_000_000)
			bufs, _ := r.find("claimwalk", "sync", "buffers", limit, 1_000_000)
			rows, _ := r.find("claimwalk", "sync", "rows/taken", limit, 1_000_000)
			fmt.Fprintf(&b, "| %d | %s | %s | %s |\n", limit, figure(ms), figure(bufs), figure(rows))
		}
	}
	if r.has("fairness") {
		b.WriteString("\n### How long a claimable group waits (1,000 groups of 30 messages and 20 hot ones of 300; one stream, 64 in flight)\n\n")
		b.WriteString("From the ack that left a group claimable to its next lease; claims: hand-outs of other groups meanwhile. A kept lease waits only for its ack. KeepWhileWaiting: how many messages in a row a lease may keep its group while another waits (MaxKeep, 16: keeps never yield, the order before schema version 26).\n\n")
		b.WriteString("| KeepWhileWaiting | p99 ms | max ms | p99 claims | max claims |\n| ---: | ---: | ---: | ---: | ---: |\n")
		for _, kw := range fairnessKeeps {
			cells := []string{fmt.Sprint(kw)}
			if kw == pgtransport.DefaultKeepWhileWaiting {
				cells[0] += " (default)"
			}
			for _, m := range fairnessMetrics {
				res, _ := r.find("fairness", "async", fairnessVariant(m, kw), fairInFlight, fairGroups)
				cells = append(cells, figure(res))
			}
			fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | "))
		}
	}
	if r.has("tenants") {
		b.WriteString(tenantsTable(r))
	}
	if r.has("latency") {
		b.WriteString("\n### Publish-to-receive latency into an idle async consumer (ms)\n\n")
		b.WriteString("From the start of the publish (what a publisher sees) and from its commit's reply (the wake-up alone); the publisher is another transport, so only the notification wakes the consumer.\n\n")
		b.WriteString("| publish | measured from | p50 | p99 |\n| --- | --- | ---: | ---: |\n")
		for _, p := range []struct{ key, name string }{
			{"go", "`Publish` (one round-trip)"},
			{"sql", "plain SQL: BEGIN, 2 INSERTs, COMMIT (four round-trips)"},
		} {
			for _, from := range []struct{ key, name string }{{"start", "its start"}, {"commit", "its commit's reply"}} {
				p50, _ := r.find("latency", "async", p.key+"/"+from.key+"/p50", 0, 0)
				p99, _ := r.find("latency", "async", p.key+"/"+from.key+"/p99", 0, 0)
				fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", p.name, from.name, figure(p50), figure(p99))
			}
		}
	}
	if r.has("poison") {
		b.WriteString("\n### Poison messages: one hot group and 10,000 groups, 1% poison\n\n")
		fmt.Fprintf(&b, "%d run(s) of each. A backlog (%s per group, %s in the hot group) drained for %s by %d workers on one async stream; a poison message's handler always Fails it (MaxAttempts %d, backoff %s-%s). msgs/s counts messages settled: acked, or dead-lettered on their last Fail. Hold: a poison message's first hand-out to the Fail that dead-lettered it; its bound is attempts × backoff max + %s slack = %s. Turn: the time between consecutive hand-outs of one group, which the round-robin sets.\n\n",
			r.s.poisonN, count(r.s.depth), count(1000*r.s.depth), r.s.poison, poisonWorkers, poisonAttempts, poisonBackoff, poisonBackMax, poisonSlack, poisonAttempts*poisonBackMax+poisonSlack)
		clean, cok := r.find("poison", "async", "clean", poisonWorkers, poisonGroups+1)
		b.WriteString("| figure | value | note |\n| --- | ---: | --- |\n")
		for _, v := range []struct{ variant, note string }{
			{"clean", "msgs/s without poison"},
			{"poison", "msgs/s with 1% poison; vs clean: "},
			{"hold p50", "ms"},
			{"hold max", "ms"},
			{"clean/turn p50", "ms"},
			{"clean/turn p99", "ms"},
			{"poison/turn p50", "ms"},
			{"poison/turn p99", "ms"},
		} {
			res, ok := r.find("poison", "async", v.variant, poisonWorkers, poisonGroups+1)
			if !ok {
				continue
			}
			note := v.note
			if v.variant == "poison" {
				note += ratio(res, clean, cok) + " (goal ≥ 0.90x)"
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", v.variant, figure(res), note)
		}
	}
	if r.has("dedup") {
		b.WriteString("\n### Publish with a DedupKey (msgs/s; each message to a new group, every key new)\n\n")
		b.WriteString("| publishers | batch | key | msgs/s | µs per message | vs no key |\n| ---: | ---: | --- | ---: | ---: | ---: |\n")
		for _, res := range r.results {
			if res.suite == "dedup" {
				batch, key, _ := strings.Cut(res.variant, " ")
				off, ok := r.find("dedup", res.system, batch+" key=off", res.workers, 0)
				fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s |\n", res.workers, strings.TrimPrefix(batch, "batch="), strings.TrimPrefix(key, "key="),
					figure(res), num(1e6*float64(res.workers)/res.median()), ratio(res, off, ok))
			}
		}
		b.WriteString("\nµs per message: publishers / msgs/s, each publisher's time per message (a batch's share of its round-trip).\n")
	}
	return b.String()
}

func (r *runner) has(suite string) bool {
	return slices.ContainsFunc(r.results, func(res result) bool { return res.suite == suite })
}

// csv has one line per figure, with every run.
func (r *runner) csv() string {
	var b strings.Builder
	b.WriteString("suite,system,variant,workers,groups,unit,median,min,max,runs,cpu_us_per_msg\n")
	for _, res := range r.results {
		lo, hi := res.spread()
		runs := make([]string, len(res.runs))
		for i, v := range res.runs {
			runs[i] = strconv.FormatFloat(v, 'f', 3, 64)
		}
		cpu := res.cpuFigure()
		if cpu == "-" {
			cpu = ""
		}
		fmt.Fprintf(&b, "%s,%s,%s,%d,%d,%s,%.3f,%.3f,%.3f,%s,%s\n", res.suite, res.system, res.variant,
			res.workers, res.groups, res.unit, res.median(), lo, hi, strings.Join(runs, ";"), cpu)
	}
	return b.String()
}

// svg charts claim+ack throughput against workers (log scale), one panel
// per group count, one line per system; River, which has no groups, is in
// every panel.
func (r *runner) svg() string {
	const (
		pw, ph       = 320, 240 // panel
		left, top    = 60, 40
		gap          = 30
		plotW, plotH = pw - left - 10, ph - top - 40
	)
	colors := map[string]string{"sync": "#1f77b4", "async": "#2ca02c", "baseline": "#d62728", "river": "#ff7f0e"}
	systems := []string{"sync", "async", "baseline", "river"}
	groups := r.s.groups
	var ymax float64
	maxW := 1
	for _, res := range r.results {
		if res.suite == "claimack" {
			ymax = max(ymax, res.median())
			maxW = max(maxW, res.workers)
		}
	}
	if ymax == 0 {
		ymax = 1
	}
	ymax = niceCeil(ymax)
	width := len(groups)*(pw+gap) + gap
	height := ph + 50
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="16" font-size="13">claim+ack throughput (median msgs/s) against workers, per group count</text>`+"\n", gap)
	xOf := func(w int) float64 { return float64(left) + math.Log2(float64(w))/math.Log2(float64(maxW))*plotW }
	yOf := func(v float64) float64 { return float64(top) + plotH - v/ymax*plotH }
	for i, g := range groups {
		ox := gap + i*(pw+gap)
		fmt.Fprintf(&b, `<g transform="translate(%d,10)">`+"\n", ox)
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">groups = %s</text>`+"\n", left, top-12, count(g))
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, top+plotH, left+plotW, top+plotH)
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, top, left, top+plotH)
		for k := 0; k <= 4; k++ {
			v := ymax * float64(k) / 4
			y := yOf(v)
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left, y, left+plotW, y, left-4, y+4, num(v))
		}
		for w := 1; w <= maxW; w *= 4 {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", xOf(w), top+plotH+14, w)
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">workers</text>`+"\n", left+plotW/2, top+plotH+30)
		for _, sys := range systems {
			var pts []string
			for _, res := range r.results {
				if res.suite == "claimack" && res.system == sys && (sys == "river" || res.groups == g) {
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(res.workers), yOf(res.median())))
				}
			}
			if len(pts) == 0 {
				continue
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", colors[sys], strings.Join(pts, " "))
			for _, p := range pts {
				xy := strings.Split(p, ",")
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="2.5" fill="%s"/>`+"\n", xy[0], xy[1], colors[sys])
			}
		}
		b.WriteString("</g>\n")
	}
	for i, sys := range systems {
		x := gap + i*150
		label := sys
		if sys == "river" {
			label = "River (no per-group order)"
		}
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="4" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", x, height-14, colors[sys], x+16, height-9, label)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
