// Package metrics records a pgtransport queue's activity as OpenTelemetry
// metrics: an Observer for pgtransport.Config.Observer (counters and
// duration histograms of every publish, claim, ack, fail, lost lease and
// handler run), and gauges read from a transport's Stats (ObserveStats).
// It is a module of its own, so the library's go.mod stays free of
// OpenTelemetry.
//
//	obs, err := metrics.New(metrics.Config{MeterProvider: provider, Queue: "orders"})
//	tr, err := pgsync.FromDSN(ctx, dsn, pgtransport.Config{Observer: obs})
//	unregister, err := obs.ObserveStats(tr.Stats, metrics.StatsOptions{})
//
// The names follow OpenTelemetry's semantic conventions for messaging
// (status: development) where one fits; the queue's own are under
// pgtransport. Every measurement has messaging.system "pgtransport" and
// messaging.destination.name (Config.Queue).
//
//	Name                                       Instrument         Unit       Attributes
//	messaging.client.sent.messages             Counter            {message}  messaging.operation.name=publish, error.type
//	messaging.client.consumed.messages         Counter            {message}  messaging.operation.name=claim
//	messaging.client.operation.duration        Histogram          s          messaging.operation.name (publish, claim, ack, fail),
//	                                                                         messaging.operation.type (send, receive, settle), error.type
//	messaging.process.duration                 Histogram          s          messaging.operation.name=process, error.type
//	pgtransport.client.acked.messages          Counter            {message}  messaging.operation.name=ack, error.type
//	pgtransport.client.failed.messages         Counter            {message}  messaging.operation.name=fail, pgtransport.outcome
//	                                                                         (retry, dead, stopped), or error.type
//	pgtransport.client.dead_lettered.messages  Counter            {message}
//	pgtransport.client.lost.leases             Counter            {lease}
//	pgtransport.queue.messages                 UpDownCounter (a)  {message}  pgtransport.priority
//	pgtransport.queue.groups                   UpDownCounter (a)  {group}    pgtransport.priority, pgtransport.group.state
//	pgtransport.queue.oldest_head.age          Gauge (a)          s          pgtransport.priority
//	pgtransport.queue.dead_letters             UpDownCounter (a)  {message}  pgtransport.priority
//	pgtransport.queue.waiting_consumers        UpDownCounter (a)  {consumer}
//
// (a): asynchronous, recorded at each collection from Stats while an
// ObserveStats registration is live. The counts are asynchronous
// UpDownCounters, as OpenTelemetry advises for values that add up across
// attributes (sum the priorities for the queue's total); a Prometheus
// exporter shows them as gauges. The age is a Gauge: it does not add up.
//
// error.type is set only on a failed operation; its values are few (see
// ErrorType), so series stay few. What is counted is what the transport
// reports to its Observer (see pgtransport.Observer): every message
// handed out is in messaging.client.consumed.messages, a lease an ack
// keeps for its group's next message (Config.MaxKeep) included; a head the
// database dead-letters at a claim (its last lease lapsed) is not in
// pgtransport.client.dead_lettered.messages, but is in
// pgtransport.queue.dead_letters.
//
// The Observer's methods are safe for concurrent use, do not block, and
// allocate nothing for a success or a known error: every attribute set is
// built by New (BenchmarkObserver measures them).
//
// The package is named metrics, after its directory, as Go packages are;
// import it under another name (pgmetrics) where metrics is taken.
package metrics
