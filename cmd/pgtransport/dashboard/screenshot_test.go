package dashboard

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

var screenshot = flag.String("screenshot", "", "write a PNG of the overview under load to this file (docs/dashboard.png), then pass")

// TestScreenshot takes the README's picture: the overview after about
// a minute of a varying publisher and a consumer whose handler fails now and
// then (parked groups, a few dead letters), with some groups paused. Run it
// with
//
//	go test -run TestScreenshot -screenshot $PWD/../../../docs/dashboard.png ./dashboard
func TestScreenshot(t *testing.T) {
	if *screenshot == "" {
		t.Skip("-screenshot not set")
	}
	is := is.New(t)
	q := newQueue(t, pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 3, RetryBackoffMin: time.Second, RetryBackoffMax: 5 * time.Second}})
	ctx, cancel := context.WithCancel(context.Background())
	for i := range 400 {
		q.publish(fmt.Sprintf("order-%04d", i), i%3, 1+i%7)
	}
	for i := range 6 {
		is.NoErr(q.tr.PauseGroup(ctx, fmt.Sprintf("order-%04d", i*37)))
	}
	for i := range 4 {
		q.publish(fmt.Sprintf("poison-%d", i), 1, 1)
	}
	start := time.Now()
	published := make(chan error, 1)
	go func() {
		var (
			err  error
			owed float64
			i    int
		)
		for ctx.Err() == nil {
			// 20-280 messages/s, in waves; the consumer takes about 190/s.
			owed += (150 + 130*math.Sin(time.Since(start).Seconds()/3.5)) / 50
			var msgs []pgtransport.Message
			for ; owed >= 1; owed-- {
				msgs = append(msgs, pgtransport.Message{Group: fmt.Sprintf("order-%04d", i*7%3000), Event: fmt.Sprintf(`{"order":%d,"type":"paid"}`, i), Priority: i % 3})
				i++
			}
			if len(msgs) > 0 {
				if _, err = q.tr.PublishMany(ctx, msgs); err != nil {
					break
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		published <- err
	}()
	worked := make(chan error, 1)
	go func() {
		n := 0
		worked <- q.tr.Work(ctx, pgtransport.WorkerConfig{WorkerID: "billing-1", Concurrency: 8}, func(ctx context.Context, l *pgtransport.Lease) error {
			time.Sleep(40 * time.Millisecond)
			n++
			if strings.HasPrefix(l.Group, "poison") || n%40 == 0 {
				return fmt.Errorf("payment gateway: 503 for %s", l.Group)
			}
			return nil
		})
	}()
	defer func() {
		cancel()
		is.NoErr(<-published)
		is.NoErr(<-worked)
	}()
	_, base := q.serve(Config{Interval: time.Second, Window: time.Minute})
	tc := tabFor(t, 2*time.Minute)
	is.NoErr(chromedp.Do(tc, chromedp.EmulateViewport(1200, 900), chromedp.Navigate(base+"/")))
	time.Sleep(60 * time.Second) // the chart fills: a picture, not a check
	// Then a moment with a backlog, if one comes (a picture, not a check).
	if err := chromedp.Do(tc, until(`parseInt(document.getElementById('depth').textContent.replace(/,/g, '')) > 300`, 30*time.Second)); err != nil {
		t.Logf("no backlog above 300 came: %v", err)
	}
	png, err := chromedp.Run(tc, chromedp.FullScreenshot(100))
	is.NoErr(err)
	is.NoErr(os.WriteFile(*screenshot, png, 0o644))
	t.Logf("wrote %s (%d bytes)", *screenshot, len(png))
}
