package history

import (
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Unix(1_800_000_000, 0)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func op(kind Kind, worker, group string, seq int64, token string, from, to int) Op {
	return Op{Kind: kind, Worker: worker, Group: group, Seq: seq, Token: token, Start: at(from), End: at(to)}
}

// valid: two messages of g, the first redelivered after its lease lapsed
// (w1's late ack is fenced off), then both acked by w2.
func valid() []Op {
	lost := op(Ack, "w1", "g", 1, "t1", 50, 51)
	lost.Outcome = Failed
	return []Op{
		op(Publish, "p", "g", 1, "", 0, 1),
		op(Publish, "p", "g", 2, "", 2, 3),
		op(Claim, "w1", "g", 1, "t1", 3, 4),
		op(Extend, "w1", "g", 1, "t1", 5, 6),
		op(Claim, "w2", "g", 1, "t2", 40, 41), // t1 lapsed
		lost,
		op(Ack, "w2", "g", 1, "t2", 60, 61),
		op(Claim, "w2", "g", 2, "t3", 62, 63),
		op(Ack, "w2", "g", 2, "t3", 64, 65),
	}
}

func TestValidHistory(t *testing.T) {
	errs, st := Check(valid(), End{})
	if len(errs) != 0 {
		t.Fatalf("valid history rejected: %v", Join(errs))
	}
	if st.Published != 2 || st.Acked != 2 || st.Deliveries != 3 || st.Redeliveries != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestCatchesEachViolation breaks the valid history one way at a time.
func TestCatchesEachViolation(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func([]Op) []Op
		left int
		want string
	}{
		{"NeverAckedAndGone", func(ops []Op) []Op { return ops[:len(ops)-1] }, 0, "never acked"},
		{"AckedTwice", func(ops []Op) []Op { return append(ops, op(Ack, "w3", "g", 2, "t3", 66, 67)) }, 0, "acked 2 times"},
		{"AckOfUnpublishedMessage", func(ops []Op) []Op {
			return append(ops, op(Claim, "w3", "g", 9, "t9", 70, 71), op(Ack, "w3", "g", 9, "t9", 72, 73))
		}, 0, "never published"},
		{"FirstDeliveriesOutOfOrder", func(ops []Op) []Op {
			ops[2].Seq, ops[4].Seq = 2, 2 // 2 before 1
			ops[6].Seq, ops[7].Seq, ops[8].Seq = 2, 1, 1
			return ops
		}, 0, "published after it"},
		{"RedeliveryNotTheHead", func(ops []Op) []Op {
			return append(ops, op(Claim, "w4", "g", 1, "t4", 80, 81))
		}, 0, "redelivered after"},
		{"OverlappingLeasesBothSettled", func(ops []Op) []Op {
			ops[5].Outcome = OK // w1's ack after w2's claim succeeded: fencing broke
			ops[5].Seq = 2
			return ops
		}, 0, "overlapped"},
		{"SettleUnderUngrantedToken", func(ops []Op) []Op {
			return append(ops, op(Nack, "w5", "g", 2, "forged", 90, 91))
		}, 0, "never granted"},
		{"RowsLeftBehind", func(ops []Op) []Op { return ops }, 1, "left after the drain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs, _ := Check(tc.edit(valid()), End{Messages: tc.left})
			if len(errs) == 0 || !strings.Contains(Join(errs).Error(), tc.want) {
				t.Fatalf("got %v, want a violation containing %q", Join(errs), tc.want)
			}
		})
	}
}

// validDead: in g, message 1 fails twice and is dead-lettered by its second
// Fail, 2 is acked, then 1 is redriven and acked, and 4 (published after
// the redrive) follows it. In h, message 3's leases lapse until a claim
// dead-letters it unseen: it is in the dead letters at the end.
func validDead() []Op {
	return []Op{
		op(Publish, "p", "g", 1, "", 0, 1),
		op(Publish, "p", "g", 2, "", 2, 3),
		op(Publish, "p", "h", 3, "", 4, 5),
		op(Claim, "w1", "g", 1, "t1", 10, 11),
		op(Fail, "w1", "g", 1, "t1", 12, 13),
		op(Claim, "w2", "h", 3, "t5", 10, 11), // lapses
		op(Claim, "w1", "g", 1, "t2", 30, 31),
		op(Fail, "w1", "g", 1, "t2", 32, 33),
		op(Dead, "w1", "g", 1, "t2", 32, 33), // the Fail used the last attempt
		op(Claim, "w1", "g", 2, "t3", 34, 35),
		op(Ack, "w1", "g", 2, "t3", 36, 37),
		op(Claim, "w2", "h", 3, "t6", 40, 41), // lapses
		op(Redrive, "op", "g", 1, "", 50, 51),
		op(Publish, "p", "g", 4, "", 52, 53),
		op(Claim, "w1", "g", 1, "t4", 60, 61),
		op(Ack, "w1", "g", 1, "t4", 62, 63),
		op(Claim, "w1", "g", 4, "t7", 64, 65),
		op(Ack, "w1", "g", 4, "t7", 66, 67),
	}
}

// without drops the ops that match.
func without(ops []Op, drop func(Op) bool) []Op { return slices.DeleteFunc(ops, drop) }

func TestValidDeadLetterHistory(t *testing.T) {
	errs, st := Check(validDead(), End{Dead: []int64{3}})
	if len(errs) != 0 {
		t.Fatalf("valid history rejected: %v", Join(errs))
	}
	if st.Published != 4 || st.Acked != 3 || st.DeadLettered != 2 || st.Redriven != 1 || st.Deliveries != 7 || st.Redeliveries != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestCatchesEachDeadLetterViolation breaks validDead one way at a time.
func TestCatchesEachDeadLetterViolation(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func([]Op) []Op
		dead []int64
		want string
	}{
		{"AckedAndDeadLettered", func(ops []Op) []Op { return ops }, []int64{3, 2}, "both acked and dead-lettered"},
		{"AckedThenRedriven", func(ops []Op) []Op { // a redrive takes a dead letter: 2 was acked
			return append(ops, op(Redrive, "op", "g", 2, "", 70, 71), op(Claim, "w1", "g", 2, "t8", 72, 73), op(Ack, "w1", "g", 2, "t8", 74, 75))
		}, []int64{3}, "both acked and dead-lettered"},
		{"NeitherAckedNorDeadLettered", func(ops []Op) []Op {
			return without(ops, func(o Op) bool { return o.Token == "t6" || o.Token == "t5" })
		}, nil, "never acked nor dead-lettered"},
		{"RedrivenNeverSettled", func(ops []Op) []Op {
			return without(ops, func(o Op) bool { return o.Kind == Ack && o.Token == "t4" })
		}, []int64{3}, "message 1 of g published, never acked nor dead-lettered"},
		{"DeadLetteredTwice", func(ops []Op) []Op { return append(ops, op(Dead, "w3", "g", 1, "t2", 34, 35)) }, []int64{3}, "dead-lettered 2 times"},
		{"DeadLetteredButLost", func(ops []Op) []Op {
			return without(ops, func(o Op) bool { return o.Kind == Redrive || o.Token == "t4" })
		}, []int64{3}, "not in the dead letters at the end"},
		{"DeadLetterOfUnpublishedMessage", func(ops []Op) []Op { return ops }, []int64{3, 9}, "in the dead letters but never published"},
		{"DeadLetteredThenDelivered", func(ops []Op) []Op { // no redrive, yet 1 comes back after 2
			return without(ops, func(o Op) bool { return o.Kind == Redrive })
		}, []int64{3}, "redelivered after 2"},
		{"RedrivenBehindALaterMessage", func(ops []Op) []Op {
			for i, o := range ops { // 4 published before the redrive, claimed after it, yet delivered before 1
				switch {
				case o.Kind == Publish && o.Seq == 4:
					ops[i].Start, ops[i].End = at(40), at(41)
				case o.Kind == Claim && o.Token == "t7":
					ops[i].Start, ops[i].End = at(55), at(56)
				case o.Kind == Ack && o.Token == "t7":
					ops[i].Start, ops[i].End = at(57), at(58)
				}
			}
			return ops
		}, []int64{3}, "delivered before 1, redriven ahead of it"},
		{"FailUnderUngrantedToken", func(ops []Op) []Op {
			return append(ops, op(Fail, "w5", "g", 4, "forged", 90, 91))
		}, []int64{3}, "never granted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs, _ := Check(tc.edit(validDead()), End{Dead: tc.dead})
			if len(errs) == 0 || !strings.Contains(Join(errs).Error(), tc.want) {
				t.Fatalf("got %v, want a violation containing %q", Join(errs), tc.want)
			}
		})
	}
}
