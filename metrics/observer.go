package metrics

import (
	"context"
	"errors"
	"fmt"
	stdsync "sync"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgtransport/pgtransport"
)

// ScopeName is the instrumentation scope (the Meter's name).
const ScopeName = "github.com/pgtransport/pgtransport/metrics"

// DurationBuckets are the explicit bucket boundaries, in seconds, of the
// duration histograms: the ones the messaging semantic conventions
// advise. A View may replace them.
var DurationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// Config configures an Observer. The zero value works: the global
// MeterProvider, the queue named "default", errors to otel.Handle.
type Config struct {
	// MeterProvider makes the Meter; nil means otel.GetMeterProvider() (the
	// global one, which forwards to whatever provider is set later).
	MeterProvider metric.MeterProvider
	// Queue is messaging.destination.name on every measurement: the name
	// operators know the queue by (its schema, say). "" means DefaultQueue.
	// Valid UTF-8.
	Queue string
	// ErrorHandler receives the errors of ObserveStats's stats function.
	// Nil means otel.Handle (the global error handler, which logs them).
	ErrorHandler func(error)
}

// Observer records a transport's activity as OpenTelemetry metrics: pass
// it as pgtransport.Config.Observer. Its methods are safe for concurrent
// use, never block, and allocate nothing on success (the attribute sets
// are built by New); an operation that erred builds its set only when
// its error.type is an SQLSTATE.
type Observer struct {
	queue  string
	handle func(error)
	base   []attribute.KeyValue // messaging.system, messaging.destination.name
	ctx    context.Context

	sent, consumed, acked, failed, dead, lost metric.Int64Counter
	opDur, procDur                            metric.Float64Histogram

	// Pre-built options, indexed by error class (0 is success).
	opOpts                           [numOps]recTable
	procOpts                         recTable
	sentOpts, ackedOpts, failErrOpts addTable
	consumedOpts                     []metric.AddOption
	lostOpts, deadOpts               []metric.AddOption
	failOpts                         map[string][]metric.AddOption // by outcome

	// Gauges (ObserveStats).
	qMessages, qGroups, qDead, qWaiting metric.Int64ObservableUpDownCounter
	qAge                                metric.Float64ObservableGauge
	meter                               metric.Meter
	prio                                map[int]priorityOpts
	waitOpts                            []metric.ObserveOption

	mu        stdsync.Mutex
	observing bool // an ObserveStats registration is live
}

// priorityOpts are a priority's pre-built gauge options.
type priorityOpts struct {
	prio   []metric.ObserveOption
	states map[pgtransport.GroupState][]metric.ObserveOption
}

var _ pgtransport.Observer = (*Observer)(nil)

type op int

const (
	opPublish op = iota
	opClaim
	opAck
	opFail
	numOps
)

var opNames = [numOps][2]string{
	opPublish: {"publish", "send"},
	opClaim:   {"claim", "receive"},
	opAck:     {"ack", "settle"},
	opFail:    {"fail", "settle"},
}

// errClass is an error.type value and the error it stands for.
type errClass struct {
	err  error
	name string
}

// errClasses are the error.type values of errors this module knows, in
// the order they are tried (ErrOutcomeUnknown wraps ctx's error too, so
// it comes before them). Another error with an SQLSTATE (a
// *pgconn.PgError) has that code as its error.type; anything else
// "_OTHER".
var errClasses = []errClass{
	{nil, ""}, // success: no error.type
	{pgtransport.ErrOutcomeUnknown, "outcome_unknown"},
	{pgtransport.ErrLeaseLost, "lease_lost"},
	{pgtransport.ErrClosed, "closed"},
	{pgtransport.ErrClockSkew, "clock_skew"},
	{pgtransport.ErrSchemaMissing, "schema_missing"},
	{pgtransport.ErrUnknownGroup, "unknown_group"},
	{pgtransport.ErrGroupNotStopped, "group_not_stopped"},
	{pgtransport.ErrNilLease, "nil_lease"},
	{pgtransport.ErrInvalidGroup, "invalid_group"},
	{pgtransport.ErrInvalidEvent, "invalid_event"},
	{pgtransport.ErrEventTooLarge, "event_too_large"},
	{pgtransport.ErrInvalidPriority, "invalid_priority"},
	{pgtransport.ErrInvalidVisibility, "invalid_visibility"},
	{pgtransport.ErrInvalidDelay, "invalid_delay"},
	{pgtransport.ErrInvalidWorkerID, "invalid_worker_id"},
	{pgtransport.ErrInvalidSchema, "invalid_schema"},
	{pgtransport.ErrInvalidConfig, "invalid_config"},
	{pgtransport.ErrInvalidBatch, "invalid_batch"},
	{pgtransport.ErrInvalidDedupKey, "invalid_dedup_key"},
	{pgtransport.ErrInvalidQuery, "invalid_query"},
	{context.Canceled, "canceled"},
	{context.DeadlineExceeded, "deadline_exceeded"},
	{nil, OtherError}, // the last: no error matched
}

// OtherError is error.type for an error this module does not classify
// (a handler's own error, a network error): the semantic conventions'
// fallback value.
const OtherError = "_OTHER"

// ErrorType returns the error.type an Observer records for err: "" for
// nil; for a pgtransport sentinel its snake_case name without the Err
// prefix ("lease_lost", "outcome_unknown", "invalid_group", …);
// "canceled" and "deadline_exceeded" for ctx's errors; the SQLSTATE of a
// database error (any error with a SQLState() string method, as
// *pgconn.PgError has); else OtherError. The values are few, so the
// attribute's cardinality stays low.
func ErrorType(err error) string {
	if i := classify(err); i >= 0 {
		return errClasses[i].name
	}
	return sqlState(err)
}

// classify returns err's index in errClasses, or -1 for an SQLSTATE
// (sqlState gives it).
func classify(err error) int {
	if err == nil {
		return 0
	}
	for i := 1; i < len(errClasses)-1; i++ {
		if errors.Is(err, errClasses[i].err) {
			return i
		}
	}
	if sqlState(err) != "" {
		return -1
	}
	return len(errClasses) - 1
}

func sqlState(err error) string {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState()
	}
	return ""
}

// New returns an Observer recording to cfg.MeterProvider's Meter
// ScopeName, with every instrument made (the Stats gauges record only
// once ObserveStats registers them). A Queue that is not valid UTF-8
// returns pgtransport.ErrInvalidConfig; an error making an instrument is
// returned wrapped.
func New(cfg Config) (*Observer, error) {
	if !utf8.ValidString(cfg.Queue) {
		return nil, fmt.Errorf("metrics: %w: Queue is not valid UTF-8", pgtransport.ErrInvalidConfig)
	}
	mp := cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	o := &Observer{
		queue:  cfg.Queue,
		handle: cfg.ErrorHandler,
		ctx:    context.Background(),
		meter:  mp.Meter(ScopeName),
	}
	if o.queue == "" {
		o.queue = DefaultQueue
	}
	if o.handle == nil {
		o.handle = otel.Handle
	}
	o.base = []attribute.KeyValue{
		attribute.String(AttrSystem, System),
		attribute.String(AttrDestination, o.queue),
	}
	if err := o.instruments(); err != nil {
		return nil, err
	}
	o.options()
	return o, nil
}

func (o *Observer) instruments() error {
	m := o.meter
	var errs [13]error
	o.sent, errs[0] = m.Int64Counter(SentMessages, metric.WithUnit("{message}"),
		metric.WithDescription("Messages publishes sent (attempted: a failed publish has error.type)."))
	o.consumed, errs[1] = m.Int64Counter(ConsumedMessages, metric.WithUnit("{message}"),
		metric.WithDescription("Leases claims handed out."))
	o.opDur, errs[2] = m.Float64Histogram(OperationDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of publish, claim, ack and fail round-trips."),
		metric.WithExplicitBucketBoundaries(DurationBuckets...))
	o.procDur, errs[3] = m.Float64Histogram(ProcessDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of handler runs."),
		metric.WithExplicitBucketBoundaries(DurationBuckets...))
	o.acked, errs[4] = m.Int64Counter(AckedMessages, metric.WithUnit("{message}"),
		metric.WithDescription("Leases acked (including those found lost)."))
	o.failed, errs[5] = m.Int64Counter(FailedMessages, metric.WithUnit("{message}"),
		metric.WithDescription("Messages failed, by what the queue did with them (pgtransport.outcome)."))
	o.dead, errs[6] = m.Int64Counter(DeadLetteredMessages, metric.WithUnit("{message}"),
		metric.WithDescription("Messages a Fail moved to the dead letters."))
	o.lost, errs[7] = m.Int64Counter(LostLeases, metric.WithUnit("{lease}"),
		metric.WithDescription("Leases found lost (another worker holds the group, or the lease lapsed)."))
	o.qMessages, errs[8] = m.Int64ObservableUpDownCounter(QueueMessages, metric.WithUnit("{message}"),
		metric.WithDescription("Messages queued, per priority (an estimate on a large table)."))
	o.qGroups, errs[9] = m.Int64ObservableUpDownCounter(QueueGroups, metric.WithUnit("{group}"),
		metric.WithDescription("Groups, per priority and state."))
	o.qAge, errs[10] = m.Float64ObservableGauge(OldestHeadAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest message at a group's head, per priority (0: none)."))
	o.qDead, errs[11] = m.Int64ObservableUpDownCounter(DeadLetters, metric.WithUnit("{message}"),
		metric.WithDescription("Dead letters, per priority (an estimate on a large table)."))
	o.qWaiting, errs[12] = m.Int64ObservableUpDownCounter(WaitingConsumers, metric.WithUnit("{consumer}"),
		metric.WithDescription("Idle async streams (and plain-SQL clients of harel_wait) waiting for a notification; blocking workers are not counted."))
	if err := errors.Join(errs[:]...); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}

// set is the base attributes plus kvs.
func (o *Observer) set(kvs ...attribute.KeyValue) attribute.Set {
	return attribute.NewSet(append(append([]attribute.KeyValue(nil), o.base...), kvs...)...)
}

func addOpt(s attribute.Set) []metric.AddOption {
	return []metric.AddOption{metric.WithAttributeSet(s)}
}

func recOpt(s attribute.Set) []metric.RecordOption {
	return []metric.RecordOption{metric.WithAttributeSet(s)}
}

func obsOpt(s attribute.Set) []metric.ObserveOption {
	return []metric.ObserveOption{metric.WithAttributeSet(s)}
}

// errKV is error.type of class i (none for success).
func errKV(name string) []attribute.KeyValue {
	if name == "" {
		return nil
	}
	return []attribute.KeyValue{attribute.String(AttrErrorType, name)}
}

// recTable and addTable hold one instrument use's options per error
// class, and its attributes (but the base) to build a set for an SQLSTATE.
type recTable struct {
	kvs  []attribute.KeyValue
	opts [][]metric.RecordOption
}

type addTable struct {
	kvs  []attribute.KeyValue
	opts [][]metric.AddOption
}

func (o *Observer) recTable(kvs ...attribute.KeyValue) recTable {
	t := recTable{kvs: kvs, opts: make([][]metric.RecordOption, len(errClasses))}
	for i, c := range errClasses {
		t.opts[i] = recOpt(o.set(append(append([]attribute.KeyValue(nil), kvs...), errKV(c.name)...)...))
	}
	return t
}

func (o *Observer) addTable(kvs ...attribute.KeyValue) addTable {
	t := addTable{kvs: kvs, opts: make([][]metric.AddOption, len(errClasses))}
	for i, c := range errClasses {
		t.opts[i] = addOpt(o.set(append(append([]attribute.KeyValue(nil), kvs...), errKV(c.name)...)...))
	}
	return t
}

// options pre-builds every attribute set the hot path uses.
func (o *Observer) options() {
	name := func(p op) attribute.KeyValue { return attribute.String(AttrOperationName, opNames[p][0]) }
	for p := range numOps {
		o.opOpts[p] = o.recTable(name(p), attribute.String(AttrOperationType, opNames[p][1]))
	}
	o.procOpts = o.recTable(attribute.String(AttrOperationName, "process"), attribute.String(AttrOperationType, "process"))
	o.sentOpts = o.addTable(name(opPublish))
	o.consumedOpts = addOpt(o.set(name(opClaim)))
	o.ackedOpts = o.addTable(name(opAck))
	o.failErrOpts = o.addTable(name(opFail))
	o.lostOpts = addOpt(o.set())
	o.deadOpts = addOpt(o.set())
	o.failOpts = make(map[string][]metric.AddOption, 4)
	for _, out := range []string{pgtransport.OutcomeRetry, pgtransport.OutcomeDead, pgtransport.OutcomeStopped, pgtransport.OutcomeSnoozed} {
		o.failOpts[out] = o.outcomeOpt(out)
	}

	o.prio = make(map[int]priorityOpts, pgtransport.MaxPriority-pgtransport.MinPriority+1)
	for p := pgtransport.MinPriority; p <= pgtransport.MaxPriority; p++ {
		o.prio[p] = o.priorityOpts(p)
	}
	o.waitOpts = obsOpt(o.set())
}

func (o *Observer) outcomeOpt(out string) []metric.AddOption {
	return addOpt(o.set(attribute.String(AttrOperationName, opNames[opFail][0]), attribute.String(AttrOutcome, out)))
}

var groupStates = []pgtransport.GroupState{
	pgtransport.GroupFree, pgtransport.GroupLeased, pgtransport.GroupParked,
	pgtransport.GroupStopped, pgtransport.GroupPaused,
}

func (o *Observer) priorityOpts(p int) priorityOpts {
	po := priorityOpts{
		prio:   obsOpt(o.set(attribute.Int(AttrPriority, p))),
		states: make(map[pgtransport.GroupState][]metric.ObserveOption, len(groupStates)),
	}
	for _, s := range groupStates {
		po.states[s] = obsOpt(o.set(attribute.Int(AttrPriority, p), attribute.String(AttrGroupState, string(s))))
	}
	return po
}

// Queue is the messaging.destination.name the Observer records.
func (o *Observer) Queue() string { return o.queue }

// record records v in h with the options of err's class from t, or, for
// an SQLSTATE, a set built now.
func (o *Observer) record(h metric.Float64Histogram, t *recTable, v float64, err error) {
	if i := classify(err); i >= 0 {
		h.Record(o.ctx, v, t.opts[i]...)
		return
	}
	h.Record(o.ctx, v, recOpt(o.set(append(append([]attribute.KeyValue(nil), t.kvs...), attribute.String(AttrErrorType, sqlState(err)))...))...)
}

// add adds n to c as record records.
func (o *Observer) add(c metric.Int64Counter, t *addTable, n int64, err error) {
	if i := classify(err); i >= 0 {
		c.Add(o.ctx, n, t.opts[i]...)
		return
	}
	c.Add(o.ctx, n, addOpt(o.set(append(append([]attribute.KeyValue(nil), t.kvs...), attribute.String(AttrErrorType, sqlState(err)))...))...)
}

func (o *Observer) duration(p op, d time.Duration, err error) {
	o.record(o.opDur, &o.opOpts[p], d.Seconds(), err)
}

// Published adds n to SentMessages (with error.type if err) and records
// the publish's duration.
func (o *Observer) Published(n int, d time.Duration, err error) {
	o.add(o.sent, &o.sentOpts, int64(n), err)
	o.duration(opPublish, d, err)
}

// Claimed adds n to ConsumedMessages and records the claim's duration
// (error.type if err; a failed claim handed out nothing, so it counts
// no message).
func (o *Observer) Claimed(n int, d time.Duration, err error) {
	if n > 0 {
		o.consumed.Add(o.ctx, int64(n), o.consumedOpts...)
	}
	o.duration(opClaim, d, err)
}

// Acked adds n to AckedMessages (with error.type if err) and records the
// ack's duration.
func (o *Observer) Acked(n int, d time.Duration, err error) {
	if n > 0 {
		o.add(o.acked, &o.ackedOpts, int64(n), err)
	}
	o.duration(opAck, d, err)
}

// Failed adds 1 to FailedMessages with its outcome (with error.type and
// no outcome if err), 1 to DeadLetteredMessages for OutcomeDead, and
// records the fail's duration.
func (o *Observer) Failed(_ *pgtransport.Lease, outcome string, d time.Duration, err error) {
	if err != nil {
		o.add(o.failed, &o.failErrOpts, 1, err)
	} else {
		opts, ok := o.failOpts[outcome]
		if !ok { // an outcome this module does not know yet
			opts = o.outcomeOpt(outcome)
		}
		o.failed.Add(o.ctx, 1, opts...)
		if outcome == pgtransport.OutcomeDead {
			o.dead.Add(o.ctx, 1, o.deadOpts...)
		}
	}
	o.duration(opFail, d, err)
}

// LeaseLost adds 1 to LostLeases.
func (o *Observer) LeaseLost(*pgtransport.Lease) {
	o.lost.Add(o.ctx, 1, o.lostOpts...)
}

// Handled records the handler's run in ProcessDuration (error.type if it
// returned an error: mostly OtherError, as a handler's errors are its
// own).
func (o *Observer) Handled(_ *pgtransport.Lease, d time.Duration, err error) {
	o.record(o.procDur, &o.procOpts, d.Seconds(), err)
}
