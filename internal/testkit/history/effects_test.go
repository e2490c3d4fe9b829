package history_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/internal/testkit/history"
)

// sum folds decimal events into their decimal running sum.
func sum(state []byte, event string) []byte {
	s, _ := strconv.Atoi(string(state))
	n, _ := strconv.Atoi(event)
	return []byte(strconv.Itoa(s + n))
}

// effectView is a clean run: two groups, each message applied once in
// order, each state its sum.
func effectView() history.EffectView {
	return history.EffectView{
		Published: []history.Message{{"a", 1, "1"}, {"b", 2, "10"}, {"a", 3, "2"}, {"b", 4, "20"}, {"a", 5, "3"}},
		Effects:   []history.Effect{{1, "a", 1}, {2, "b", 2}, {3, "a", 3}, {4, "a", 5}, {5, "b", 4}},
		States:    map[string][]byte{"a": []byte("6"), "b": []byte("30")},
		Fold:      sum,
	}
}

// TestCheckEffects: the effect view's checker passes a clean run and
// catches a duplicate, a missing effect, a reordering and a wrong state,
// each named.
func TestCheckEffects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(v *history.EffectView)
		want   string // in the one error; "" for none
	}{
		{"clean", func(*history.EffectView) {}, ""},
		{"duplicate", func(v *history.EffectView) { v.Effects = append(v.Effects, history.Effect{6, "a", 5}) }, "a/5: applied more than once"},
		{"missing", func(v *history.EffectView) { v.Effects = v.Effects[:4] }, "b/4: never applied"},
		{"reordered", func(v *history.EffectView) { v.Effects[0].ID, v.Effects[2].ID = 3, 1 }, "group a: message 1 applied after 3"},
		{"wrong state", func(v *history.EffectView) { v.States["b"] = []byte("20") }, `group b: state "20", want "30"`},
		{"unpublished", func(v *history.EffectView) { v.Effects = append(v.Effects, history.Effect{7, "a", 9}) }, "a/9: no such message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			v := effectView()
			tc.change(&v)
			errs, stats := history.CheckEffects(v)
			is.Equal(stats.Groups, 2)
			if tc.want == "" {
				is.Equal(len(errs), 0) // a clean run
				return
			}
			is.Equal(len(errs), 1)                              // one violation
			is.True(strings.Contains(errs[0].Error(), tc.want)) // named
		})
	}
}
