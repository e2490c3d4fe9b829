package history

import (
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
	errs, st := Check(valid(), 0, 0)
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
			errs, _ := Check(tc.edit(valid()), tc.left, 0)
			if len(errs) == 0 || !strings.Contains(Join(errs).Error(), tc.want) {
				t.Fatalf("got %v, want a violation containing %q", Join(errs), tc.want)
			}
		})
	}
}
