package dashboard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// text is the text of the element sel selects (CSS), trimmed.
func text(t *testing.T, tc context.Context, sel string) string {
	t.Helper()
	// A click that navigates can leave chromedp holding node ids of the
	// page it left ("No node with given id found"): ask again, briefly.
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var s string
		if s, err = chromedp.Run(tc, chromedp.Text(chromedp.CSS(sel))); err == nil {
			return strings.TrimSpace(s)
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Fatalf("text of %s: %v", sel, err)
	return ""
}

// eval is the value of a JavaScript expression in the page.
func eval[T any](t *testing.T, tc context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(tc, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// until waits, up to d, for a JavaScript expression to be true in the
// page.
func until(expr string, d time.Duration) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(d))
}

// TestPageShowsTheQueue: the overview, a group's page and a dead letter's
// page show what the database holds.
func TestPageShowsTheQueue(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	ctx := context.Background()
	q := newQueue(t, pgtransport.Config{Policy: &pgtransport.Policy{MaxAttempts: 1}})
	// Two dead letters: the only groups when they are claimed and failed.
	q.publish("d-1", 0, 1)
	q.publish("d-2", 0, 1)
	ls, err := q.tr.ClaimMany(ctx, "w", time.Minute, 0, 2)
	is.NoErr(err)
	is.Equal(len(ls), 2)
	for _, l := range ls {
		is.NoErr(q.tr.Fail(ctx, l, fmt.Errorf("boom in %s", l.Group)))
	}
	// 1+2+...+12 = 78 messages in 12 groups over three priorities; one
	// paused, one leased.
	for i := 1; i <= 12; i++ {
		q.publish(fmt.Sprintf("g-%02d", i), i%3, i)
	}
	is.NoErr(q.tr.PauseGroup(ctx, "g-12"))
	lease, err := q.tr.Claim(ctx, "w", time.Minute, 0)
	is.NoErr(err)
	is.True(lease != nil)

	_, base := q.serve(Config{Interval: 200 * time.Millisecond})
	tc := tab(t)
	check := func() {
		t.Helper()
		is.Equal(digits(text(t, tc, "#depth")), fmt.Sprint(q.count(`SELECT count(*) FROM %s.transport_messages`)))
		is.Equal(digits(text(t, tc, "#groups")), fmt.Sprint(q.count(`SELECT count(*) FROM %s.transport_groups`)))
		is.Equal(digits(text(t, tc, "#paused")), fmt.Sprint(q.count(`SELECT count(*) FROM %s.transport_groups WHERE paused`)))
		is.Equal(digits(text(t, tc, "#dead")), fmt.Sprint(q.count(`SELECT count(*) FROM %s.transport_dead_letters`)))
		is.Equal(text(t, tc, "#depth"), "78")
		is.Equal(text(t, tc, "#groups"), "12")
		is.Equal(text(t, tc, "#leased"), "1")
		is.Equal(text(t, tc, "#paused"), "1")
		is.Equal(text(t, tc, "#free"), "10")
		is.Equal(text(t, tc, "#dead"), "2")
		is.Equal(text(t, tc, "#priorities tr:nth-child(3) td:nth-child(2)"), "4")                                                // priority 2: g-02, g-05, g-08, g-11
		is.True(strings.Contains(text(t, tc, "main"), "idle streams waiting for a notification (blocking workers not counted)")) // what the count counts
	}
	is.NoErr(chromedp.Do(tc, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#depth"))))
	check() // as the server rendered it
	// Once the script has polled (the depth chart has a line), as it wrote it.
	is.NoErr(chromedp.Do(tc, until(`document.getElementById('line-depth').getAttribute('d').length > 0`, 10*time.Second)))
	check()

	// The leased group's page: its holder and next messages.
	is.NoErr(chromedp.Do(tc, chromedp.Navigate(base+"/group?g="+url.QueryEscape(lease.Group)), chromedp.WaitVisible(chromedp.CSS("#group-state"))))
	is.Equal(text(t, tc, "#group-state"), "leased")
	is.Equal(text(t, tc, "#group-holder"), lease.Token)
	n, _ := strconv.Atoi(strings.TrimPrefix(lease.Group, "g-"))
	is.Equal(eval[int](t, tc, `document.querySelectorAll('#peek tbody tr').length`), n) // every message of the group
	is.Equal(text(t, tc, "#peek tbody tr:first-child td:nth-child(4)"), lease.Event)    // head first
	is.True(!strings.Contains(text(t, tc, "main"), "Pause…"))                           // actions are off

	// The dead letters: the list, then one.
	is.NoErr(chromedp.Do(tc, chromedp.Navigate(base+"/dead"), chromedp.WaitVisible(chromedp.CSS("#dead-table"))))
	is.Equal(eval[int](t, tc, `document.querySelectorAll('#dead-table tbody tr').length`), 2)
	is.NoErr(chromedp.Do(tc, chromedp.Click(chromedp.CSS("#dead-table tbody tr:first-child a")), chromedp.WaitVisible(chromedp.CSS("#letter-error"))))
	is.Equal(text(t, tc, "#letter-error"), "boom in d-1")
	is.Equal(text(t, tc, "#letter-attempts"), "1")
	is.Equal(text(t, tc, "#letter-event"), "d-1-1")

	// A stuck-first list.
	is.NoErr(chromedp.Do(tc, chromedp.Navigate(base+"/groups?list=paused"), chromedp.WaitVisible(chromedp.CSS("#groups-table"))))
	is.Equal(text(t, tc, "#groups-table tbody tr:first-child td:first-child"), "g-12")
}

// TestChartMoves: while a publisher and a consumer run, the chart's lines
// change, and the acked rate is above zero.
func TestChartMoves(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	q := newQueue(t, pgtransport.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	published := make(chan error, 1)
	go func() {
		var err error
		for i := 0; ctx.Err() == nil; i++ {
			if _, err = q.tr.Publish(ctx, fmt.Sprintf("g-%d", i%20), fmt.Sprint(i), 0); err != nil {
				break
			}
			time.Sleep(2 * time.Millisecond) // a steady publisher, not a flood
		}
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		published <- err
	}()
	worked := make(chan error, 1)
	go func() {
		worked <- q.tr.Work(ctx, pgtransport.WorkerConfig{Concurrency: 4}, func(context.Context, *pgtransport.Lease) error { return nil })
	}()
	defer func() {
		cancel()
		is.NoErr(<-published) // the publisher
		is.NoErr(<-worked)    // the consumer
	}()

	_, base := q.serve(Config{Interval: 250 * time.Millisecond, Window: time.Minute})
	tc := tab(t)
	path := func(id string) string {
		return eval[string](t, tc, `document.getElementById('`+id+`').getAttribute('d')`)
	}
	// Three segments of the published line: four samples.
	is.NoErr(chromedp.Do(tc, chromedp.Navigate(base+"/"),
		until(`(document.getElementById('line-published').getAttribute('d').match(/L/g) || []).length >= 3`, 15*time.Second)))
	first := path("line-published")
	is.NoErr(chromedp.Do(tc, until(`document.getElementById('line-published').getAttribute('d') !== `+strconv.Quote(first), 10*time.Second)))
	second := path("line-published")
	is.True(first != second) // the chart moved
	is.NoErr(chromedp.Do(tc, until(`parseFloat(document.getElementById('rate-acked').textContent.replace(/,/g, '')) > 0`, 10*time.Second)))
	is.True(path("line-acked") != "") // acked is drawn too
	t.Logf("published path %d -> %d chars; published %s/s, acked %s/s", len(first), len(second), text(t, tc, "#rate-published"), text(t, tc, "#rate-acked"))
}

// TestActions: with actions off the page offers none and the server
// refuses them; with actions on, pausing from the page pauses the group.
func TestActions(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	ctx := context.Background()
	q := newQueue(t, pgtransport.Config{})
	q.publish("g", 0, 3)
	paused := func() bool {
		return q.count(`SELECT count(*) FROM %s.transport_groups WHERE group_id = 'g' AND paused`) == 1
	}
	tc := tab(t)

	// Off.
	off, offURL := q.serve(Config{})
	is.NoErr(chromedp.Do(tc, chromedp.Navigate(offURL+"/group?g=g"), chromedp.WaitVisible(chromedp.CSS("#group-state"))))
	body := text(t, tc, "main")
	is.True(strings.Contains(body, "Read-only")) // says so
	is.True(!strings.Contains(body, "Pause…"))   // offers no action
	is.NoErr(chromedp.Do(tc, chromedp.Navigate(offURL+"/confirm?do=pause&group=g")))
	is.True(strings.Contains(text(t, tc, "#error"), "actions are off"))
	// Even a well-formed POST with the token is refused.
	resp, err := http.PostForm(offURL+"/action", url.Values{"token": {off.token}, "do": {"pause"}, "group": {"g"}})
	is.NoErr(err)
	is.NoErr(resp.Body.Close())
	is.Equal(resp.StatusCode, http.StatusForbidden)
	is.True(!paused())

	// On: click Pause, confirm.
	_, onURL := q.serve(Config{AllowActions: true})
	is.NoErr(chromedp.Do(tc,
		chromedp.Navigate(onURL+"/group?g=g"),
		chromedp.Click(chromedp.CSS("#pause")),
		chromedp.WaitVisible(chromedp.CSS("#confirm")),
	))
	is.True(strings.HasPrefix(text(t, tc, "#question"), `Pause group "g"?`))
	is.True(!paused()) // nothing yet: it asks first
	is.NoErr(chromedp.Do(tc,
		chromedp.Click(chromedp.CSS("#confirm")),
		chromedp.WaitVisible(chromedp.CSS("#flash")),
	))
	is.Equal(text(t, tc, "#flash"), "Group paused.")
	is.Equal(text(t, tc, "#group-state"), "paused")
	is.True(paused()) // in the database
	g, err := q.tr.Group(ctx, "g")
	is.NoErr(err)
	is.Equal(g.State, pgtransport.GroupPaused)

	// Resume the same way.
	is.NoErr(chromedp.Do(tc,
		chromedp.Click(chromedp.CSS("#resume")),
		chromedp.WaitVisible(chromedp.CSS("#confirm")),
		chromedp.Click(chromedp.CSS("#confirm")),
		chromedp.WaitVisible(chromedp.CSS("#flash")),
	))
	is.Equal(text(t, tc, "#group-state"), "free")
	is.True(!paused())
}

// TestCrossSiteRefused: a POST from another site, or without the token,
// is refused, even with actions on; a DNS-rebinding Host is refused.
func TestCrossSiteRefused(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	q := newQueue(t, pgtransport.Config{})
	q.publish("g", 0, 1)
	s, base := q.serve(Config{AllowActions: true})
	paused := func() bool {
		return q.count(`SELECT count(*) FROM %s.transport_groups WHERE group_id = 'g' AND paused`) == 1
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	post := func(header http.Header, form url.Values) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+"/action", strings.NewReader(form.Encode()))
		is.NoErr(err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := client.Do(req)
		is.NoErr(err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		is.NoErr(err)
		return resp.StatusCode, string(b)
	}
	form := url.Values{"token": {s.token}, "do": {"pause"}, "group": {"g"}}
	noToken := url.Values{"do": {"pause"}, "group": {"g"}}
	wrong := url.Values{"token": {strings.Repeat("0", 64)}, "do": {"pause"}, "group": {"g"}}
	for _, c := range []struct {
		name   string
		header http.Header
		form   url.Values
		why    string
	}{
		{"foreign Origin", http.Header{"Origin": {"http://evil.example"}}, form, "cross-site"},
		{"cross-site fetch", http.Header{"Sec-Fetch-Site": {"cross-site"}}, form, "cross-site"},
		{"same-site fetch", http.Header{"Sec-Fetch-Site": {"same-site"}, "Origin": {"http://localhost"}}, form, "cross-site"},
		{"no token", http.Header{"Origin": {base}}, noToken, "token"},
		{"no token, no Origin", nil, noToken, "token"},
		{"wrong token", http.Header{"Origin": {base}, "Sec-Fetch-Site": {"same-origin"}}, wrong, "token"},
	} {
		code, body := post(c.header, c.form)
		is.Equal(code, http.StatusForbidden)   // refused
		is.True(strings.Contains(body, c.why)) // for the reason given
		is.True(!paused())                     // nothing done
		t.Logf("%s: %s", c.name, strings.TrimSpace(body))
	}
	// GET does nothing.
	resp, err := client.Get(base + "/action?" + form.Encode())
	is.NoErr(err)
	is.NoErr(resp.Body.Close())
	is.Equal(resp.StatusCode, http.StatusMethodNotAllowed)
	// A rebinding page names the server by its own host name.
	req, _ := http.NewRequest(http.MethodGet, base+"/confirm?do=pause&group=g", nil)
	req.Host = "evil.example"
	resp, err = client.Do(req)
	is.NoErr(err)
	is.NoErr(resp.Body.Close())
	is.Equal(resp.StatusCode, http.StatusMisdirectedRequest)
	is.True(!paused())

	// A real browser on another site's page, posting a form that even
	// holds the token, is refused.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<form id="f" method="post" action="%s/action"><input name="token" value="%s"><input name="do" value="pause"><input name="group" value="g"></form><script>document.getElementById('f').submit()</script>`, base, s.token)
	}))
	defer evil.Close()
	evilURL := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1) // another origin
	tc := tab(t)
	is.NoErr(chromedp.Do(tc, chromedp.Navigate(evilURL),
		until(`location.pathname === '/action' && document.body.innerText.length > 0`, 10*time.Second)))
	is.True(strings.Contains(text(t, tc, "body"), "cross-site")) // the browser's post was refused
	is.True(!paused())

	// The same POST from the dashboard's origin works: the refusals above
	// were for the reasons given.
	code, _ := post(http.Header{"Origin": {base}, "Sec-Fetch-Site": {"same-origin"}}, form)
	is.Equal(code, http.StatusSeeOther)
	is.True(paused())
}
