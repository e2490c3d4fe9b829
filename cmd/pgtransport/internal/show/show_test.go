package show

import (
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

func TestClip(t *testing.T) {
	is := is.New(t)
	is.Equal(Clip("a\n\tb  c", 10), "a b c") // one line, runs of space as one
	is.Equal(Clip("abcdef", 3), "abc…")      // cut, with an ellipsis
	is.Equal(Clip("abc", 3), "abc")          // fits: whole
}

func TestPriority(t *testing.T) {
	is := is.New(t)
	p := Priority(pgtransport.PriorityStats{Priority: 2, Groups: 7, OldestHeadAge: 1500 * time.Millisecond})
	is.Equal(*p.Priority, 2)
	is.Equal(p.Groups, int64(7))
	is.Equal(p.OldestHeadAge, 1.5)                                                    // seconds
	is.Equal(Priority(pgtransport.PriorityStats{Priority: -1}).Priority, (*int)(nil)) // the total: null
}

func TestAge(t *testing.T) {
	is := is.New(t)
	is.Equal(Age(0), "-")
	is.Equal(Age(59*time.Second), "59s")
	is.Equal(Age(64*time.Second), "1m04s")
	is.Equal(Age(2*time.Hour+5*time.Minute), "2h05m")
	is.Equal(Age(76*time.Hour), "3d04h")
}
