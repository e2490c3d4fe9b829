package core

import "testing"

// TestParkingWakesOldestFirst: a wake-up goes to the oldest waiters, never
// to the waker's own ticket, and a ticket left is not woken.
func TestParkingWakesOldestFirst(t *testing.T) {
	woken := func(ts ...*Ticket) []bool {
		got := make([]bool, len(ts))
		for i, tk := range ts {
			select {
			case <-tk.C():
				got[i] = true
			default:
			}
		}
		return got
	}
	for _, tc := range []struct {
		name string
		wake func(p *Parking, a, b, c *Ticket)
		want []bool
	}{
		{"one", func(p *Parking, _, _, _ *Ticket) { p.Wake(1) }, []bool{true, false, false}},
		{"two", func(p *Parking, _, _, _ *Ticket) { p.Wake(2) }, []bool{true, true, false}},
		{"all", func(p *Parking, _, _, _ *Ticket) { p.Wake(-1) }, []bool{true, true, true}},
		{"more than wait", func(p *Parking, _, _, _ *Ticket) { p.Wake(5) }, []bool{true, true, true}},
		{"none", func(p *Parking, _, _, _ *Ticket) { p.Wake(0) }, []bool{false, false, false}},
		{"not the waker's own", func(p *Parking, a, _, _ *Ticket) { p.WakeOthers(1, a) }, []bool{false, true, false}},
		{"all others", func(p *Parking, _, b, _ *Ticket) { p.WakeOthers(-1, b) }, []bool{true, false, true}},
		{"a ticket left is passed over", func(p *Parking, a, _, _ *Ticket) { a.Done(); p.Wake(1) }, []bool{false, true, false}},
		{"woken once", func(p *Parking, _, _, _ *Ticket) { p.Wake(1); p.Wake(1) }, []bool{true, true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p Parking
			a, b, c := p.Ticket(), p.Ticket(), p.Ticket()
			tc.wake(&p, a, b, c)
			got := woken(a, b, c)
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("woken %v, want %v", got, tc.want)
				}
			}
		})
	}
}
