package metrics

// The instruments' names, written once. Those under messaging. are
// OpenTelemetry's messaging semantic conventions (status: development);
// those under pgtransport. are this queue's own, named in the same style.
const (
	// SentMessages counts the messages publishes sent (Observer.Published's
	// n, errors included, with error.type). Unit {message}.
	SentMessages = "messaging.client.sent.messages"
	// ConsumedMessages counts the leases claims handed out (Observer.Claimed's
	// n). Unit {message}.
	ConsumedMessages = "messaging.client.consumed.messages"
	// OperationDuration is the duration of each publish, claim, ack and
	// fail round-trip (messaging.operation.name). Unit s.
	OperationDuration = "messaging.client.operation.duration"
	// ProcessDuration is the duration of each handler run of the handler
	// runtime (Work). Unit s.
	ProcessDuration = "messaging.process.duration"

	// AckedMessages counts acked leases (Observer.Acked's n, which counts
	// leases found lost too). Unit {message}.
	AckedMessages = "pgtransport.client.acked.messages"
	// FailedMessages counts Fail calls, by pgtransport.outcome (retry, dead,
	// stopped); a Fail that erred has error.type and no outcome. Unit
	// {message}.
	FailedMessages = "pgtransport.client.failed.messages"
	// DeadLetteredMessages counts the messages a Fail moved to the dead
	// letters (FailedMessages with outcome dead). A head whose last lease
	// lapsed is dead-lettered by the database at its group's next claim,
	// unseen by the client: watch DeadLetters for the total. Unit {message}.
	DeadLetteredMessages = "pgtransport.client.dead_lettered.messages"
	// LostLeases counts leases found lost (Observer.LeaseLost). Unit {lease}.
	LostLeases = "pgtransport.client.lost.leases"

	// QueueMessages is the queue's depth, per pgtransport.priority (Stats:
	// Messages, exact while the table is small, an estimate past that).
	// Unit {message}.
	QueueMessages = "pgtransport.queue.messages"
	// QueueGroups counts groups per pgtransport.priority and
	// pgtransport.group.state. Unit {group}.
	QueueGroups = "pgtransport.queue.groups"
	// OldestHeadAge is the age of the oldest message waiting at a group's
	// head, per pgtransport.priority (0: none). Unit s.
	OldestHeadAge = "pgtransport.queue.oldest_head.age"
	// DeadLetters counts the dead letters, per pgtransport.priority. Unit
	// {message}.
	DeadLetters = "pgtransport.queue.dead_letters"
	// WaitingConsumers counts idle consumers waiting for a wake-up. Unit
	// {consumer}.
	WaitingConsumers = "pgtransport.queue.waiting_consumers"
)

// Attribute keys.
const (
	// AttrSystem is messaging.system; its value is always System.
	AttrSystem = "messaging.system"
	// AttrDestination is messaging.destination.name: Config.Queue.
	AttrDestination = "messaging.destination.name"
	// AttrOperationName is messaging.operation.name: publish, claim, ack,
	// fail or process.
	AttrOperationName = "messaging.operation.name"
	// AttrOperationType is messaging.operation.type: send (publish),
	// receive (claim), settle (ack, fail) or process.
	AttrOperationType = "messaging.operation.type"
	// AttrErrorType is error.type, set only when the operation failed (see
	// ErrorType).
	AttrErrorType = "error.type"
	// AttrOutcome is pgtransport.outcome: what a Fail did (retry, dead,
	// stopped, snoozed: pgtransport.OutcomeRetry, OutcomeDead,
	// OutcomeStopped, OutcomeSnoozed).
	AttrOutcome = "pgtransport.outcome"
	// AttrPriority is pgtransport.priority, an int
	// (pgtransport.MinPriority..MaxPriority).
	AttrPriority = "pgtransport.priority"
	// AttrGroupState is pgtransport.group.state: a pgtransport.GroupState
	// (free, leased, parked, stopped, paused).
	AttrGroupState = "pgtransport.group.state"
)

// System is the value of messaging.system.
const System = "pgtransport"

// DefaultQueue is messaging.destination.name when Config.Queue is "".
const DefaultQueue = "default"
