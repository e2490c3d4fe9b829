package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
	"github.com/pgtransport/pgtransport/internal/testkit/pgtest"
	pgsync "github.com/pgtransport/pgtransport/sync"
)

// The jobs workload is a public cross-system queue benchmark's: every job
// its own group, a 1 ms handler, 64 jobs in flight on one async stream, and
// a producer that holds the queue at 4,000 jobs with PublishMany batches of
// 128. It reports jobs/s and the share of this process's active backends
// that pg_stat_activity shows waiting on an advisory lock: the
// lost-publish guard's publishers waiting for drainers (bench/README.md, "Jobs").
const (
	jobsInFlight = 64
	jobsDepth    = 4000
	jobsBatch    = 128
	jobsHandler  = time.Millisecond
	jobsSampling = 5 * time.Millisecond
)

func (r *runner) jobs(ctx context.Context) error {
	rate := result{suite: "jobs", system: "async", workers: jobsInFlight, unit: "jobs/s"}
	wait := result{suite: "jobs", system: "async", variant: "advisory-wait", workers: jobsInFlight, unit: "%"}
	for run := range r.s.runs {
		r.progress("jobs       in-flight=%d depth=%d batch=%d run %d/%d", jobsInFlight, jobsDepth, jobsBatch, run+1, r.s.runs)
		m, err := r.jobsOnce(ctx)
		if err != nil {
			return err
		}
		r.progress("jobs       %.0f jobs/s, %.1f%% of %d sampled active backends waiting on Lock:advisory, queue depth %.0f on average, CPU %.0f µs/job",
			m.jps, m.share, m.active, m.depth, m.cpu)
		rate.runs = append(rate.runs, m.jps)
		rate.addCPU(m.cpu)
		wait.runs = append(wait.runs, m.share)
	}
	r.add(rate)
	r.add(wait)
	return nil
}

// jobsRun is what one run measured.
type jobsRun struct {
	jps    float64 // jobs acked per second
	share  float64 // % of sampled active backends waiting on Lock:advisory
	active int64   // active backends seen over all samples
	depth  float64 // mean queue depth at the samples: the producer kept up if near jobsDepth
	cpu    float64 // machine CPU µs per job, 0 if unknown
}

// jobsOnce runs the workload in a fresh schema: it fills the queue, lets
// the stream warm up, then measures for the window.
func (r *runner) jobsOnce(ctx context.Context) (m jobsRun, err error) {
	db, err := pgtest.Open(jobsInFlight/4 + 8)
	if err != nil {
		return m, err
	}
	defer func() { _ = db.Drop() }()
	cfg := pgtransport.Config{Schema: db.Schema}
	pub, err := pgsync.New(ctx, db.Pool, cfg)
	if err != nil {
		return m, err
	}
	tr, err := async.New(ctx, db.Pool, cfg)
	if err != nil {
		return m, err
	}
	defer tr.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var published, acked atomic.Int64
	c := newChecker(1 << 62)
	acks := make(chan struct{}, 1) // a hint: an ack came back, the producer may top up
	stop := make(chan struct{})    // closed: producer and workers stop
	filled := make(chan struct{})  // closed when the queue first reached its depth
	producerErr := make(chan error, 1)
	go func() {
		msgs := make([]pgtransport.Message, jobsBatch)
		first := true
		for job := 0; ; {
			if published.Load()-acked.Load() > jobsDepth-jobsBatch {
				if first {
					close(filled)
					first = false
				}
				select {
				case <-stop:
					producerErr <- nil
					return
				case <-acks:
				}
				continue
			}
			for i := range msgs {
				msgs[i] = pgtransport.Message{Group: fmt.Sprintf("job-%d", job), Event: "e"}
				job++
			}
			if _, err := pub.PublishMany(ctx, msgs); err != nil {
				producerErr <- err
				return
			}
			published.Add(jobsBatch)
		}
	}()
	select {
	case <-filled:
	case err := <-producerErr:
		return m, fmt.Errorf("jobs: producer: %w", err)
	}

	s, err := tr.Stream(ctx, async.StreamConfig{WorkerID: "jobs", Visibility: time.Minute, MaxInFlight: jobsInFlight})
	if err != nil {
		close(stop)
		<-producerErr
		return m, err
	}
	// Results of acks, in the order they were asked: a worker hands its ack
	// over and takes its next job, as a job runner's completer would.
	results := make(chan (<-chan error), 2*jobsInFlight)
	collected := make(chan error, 1)
	go func() {
		var first error
		for res := range results {
			if err := <-res; err != nil && first == nil {
				first = err
			} else if err == nil {
				c.ack()
				acked.Add(1)
				select {
				case acks <- struct{}{}:
				default:
				}
			}
		}
		collected <- first
	}()
	workersDone := make(chan error, 1)
	go func() {
		workersDone <- parallel(jobsInFlight, func(int) error {
			for {
				select {
				case <-stop:
					return nil
				case l, ok := <-s.C():
					if !ok {
						return s.Err()
					}
					c.claimed(l.Group, l.Seq)
					time.Sleep(jobsHandler)
					results <- tr.Ack(ctx, l)
				}
			}
		})
	}()

	// Warm up, then measure: acks over the window, and pg_stat_activity
	// sampled every few ms on a connection of its own.
	time.Sleep(500 * time.Millisecond)
	conn, err := db.Pool.Acquire(ctx)
	var waiting, depth, samples int64
	if err == nil {
		from, start, before := acked.Load(), time.Now(), readCPU()
		for deadline := start.Add(r.s.jobs); time.Now().Before(deadline); time.Sleep(jobsSampling) {
			var w, a int64
			err = conn.QueryRow(ctx, `
				SELECT count(*) FILTER (WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'), count(*)
				  FROM pg_stat_activity
				 WHERE application_name = current_setting('application_name')
				   AND state = 'active' AND pid <> pg_backend_pid()`).Scan(&w, &a)
			if err != nil {
				break
			}
			waiting += w
			m.active += a
			depth += published.Load() - acked.Load()
			samples++
		}
		n := acked.Load() - from
		m.jps = float64(n) / time.Since(start).Seconds()
		m.cpu, _ = perOp(before, readCPU(), n)
		conn.Release()
	}

	close(stop)
	werr := <-workersDone
	perr := <-producerErr
	s.Close()
	close(results)
	cerr := <-collected
	for _, e := range []error{err, werr, perr, cerr} {
		if e != nil {
			return m, fmt.Errorf("jobs: %w", e)
		}
	}
	if err := c.verify(ctx, db, published.Load()); err != nil {
		return m, fmt.Errorf("jobs: %w", err)
	}
	if m.active > 0 {
		m.share = 100 * float64(waiting) / float64(m.active)
	}
	if samples > 0 {
		m.depth = float64(depth) / float64(samples)
	}
	return m, nil
}
