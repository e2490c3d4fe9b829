package async_test

import (
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
	"github.com/pgtransport/pgtransport/async"
)

// TestStreamSkipsPausedGroup: a stream never receives a paused group's
// messages, and a resume from another process's transport (here the
// blocking one beside it) reaches the idle stream by notification (the
// fallback sweep is a minute away), its messages in order.
func TestStreamSkipsPausedGroup(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	tr, st, _ := setup(t, pgtransport.Config{IdleSweep: time.Minute})
	for _, ev := range []string{"g-0", "g-1", "g-2"} {
		_, err := st.Publish(ctx(t), "g", ev, 0)
		is.NoErr(err)
	}
	is.NoErr(st.PauseGroup(ctx(t), "g"))
	_, err := st.Publish(ctx(t), "x", "x-0", 0)
	is.NoErr(err)
	s := stream(t, tr, async.StreamConfig{MaxInFlight: 4})
	l := receive(t, s, 10*time.Second)
	is.Equal(l.Event, "x-0") // the other group flows
	is.NoErr(<-tr.Ack(ctx(t), l))
	select {
	case l := <-s.C():
		t.Fatalf("a paused group's message was streamed: %+v", l)
	case <-time.After(500 * time.Millisecond): // absence has no signal to wait on
	}
	eventually(t, 10*time.Second, "an idle stream counted in Stats.Waiting", func() bool {
		s, err := st.Stats(ctx(t))
		return err == nil && s.Waiting == 1
	})
	is.NoErr(st.ResumeGroup(ctx(t), "g"))
	for _, want := range []string{"g-0", "g-1", "g-2"} {
		l := receive(t, s, 10*time.Second) // woken well before the sweep
		is.Equal(l.Event, want)            // in order
		is.NoErr(<-tr.Ack(ctx(t), l))
	}
}
