package core

// The wake-up policy, in one place.
//
// Callers with nothing to do in this process (ClaimWait callers, idle async
// streams) park on the core's Parking. They look again when the earliest
// lease or park they last saw runs out (Wait tells them when), at the
// latest after Config.IdleSweep, and whenever an operation through this
// core may have made a group claimable for them. That operation wakes one
// of them per such group, oldest first:
//
//   - Publish wakes 1, PublishMany of n messages n: each message may create
//     a group or give an idle one its head.
//   - PublishTx wakes nobody: its message is invisible until the caller
//     commits, which the core does not see.
//   - Ack, and each ack of AckMany or of a stream's exchange that held and
//     did not keep its group (Freed), wakes 1. The group is freed with
//     messages left or, drained, deleted; the result does not tell which,
//     and the woken caller's empty claim is all a wrong guess costs.
//   - AckNext wakes 1 when it frees the group, nobody when it keeps it.
//   - Nack wakes 1, with or without a delay: a delay parks the group, and a
//     parked caller only learns the park's end (to time its sleep by) by
//     looking again. Fail wakes 1 too, for the same reason, whatever it
//     came to (parked for a backoff, its head dead-lettered so the group
//     goes on, or the group stopped), and so does Release (a give-back).
//   - Redrive wakes 1 per message put back (each may ready a group);
//     RestartGroup wakes 1.
//   - Claim, ClaimMany, Extend, DeadLetters and PurgeDeadLetters wake
//     nobody: they free nothing.
//   - A call that fails wakes nobody, ErrLeaseLost included. A lost lease
//     changed nothing: its group is held by whoever claimed it after the
//     lease ran out, or has been claimable since the lease ran out, a
//     moment parked callers already time their sleep by. Either way there
//     is nothing new to look for.
//
// A stream passes over its own ticket when it wakes for its own
// round-trips (Parking.WakeOthers): what it freed is for the others.

// wakesPublish is how many parked callers a publish of n messages wakes.
func wakesPublish(n int, err error) int {
	if err != nil {
		return 0
	}
	return n
}

// wakesSettle is how many parked callers an ack, a nack, a fail or a
// release wakes.
func wakesSettle(err error) int {
	if err != nil {
		return 0
	}
	return 1
}

// Freed is how many groups a batch of acks freed, and so how many parked
// callers it wakes: each ack that held and did not keep its group.
func Freed(settled []Settled) int {
	n := 0
	for _, s := range settled {
		if s.Err == nil && s.Next == nil {
			n++
		}
	}
	return n
}
