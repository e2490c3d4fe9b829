package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport"
)

// startServe runs serve with args in the background and returns the
// dashboard's URL, what it printed, and what stops it (Ctrl-C) and returns
// its exit code.
func startServe(t *testing.T, h *harness, args ...string) (string, *syncBuffer, func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stderr := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		args := append([]string{"--dsn=" + testDSN(), "--schema=" + h.schema, "serve", "--addr", "127.0.0.1:0"}, args...)
		done <- run(ctx, args, &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: stderr, getenv: func(string) string { return "" }})
	}()
	stop := func() int {
		cancel()
		select {
		case code := <-done:
			return code
		case <-time.After(10 * time.Second):
			t.Fatal("serve did not stop")
			return -1
		}
	}
	deadline := time.After(10 * time.Second)
	for {
		if _, rest, ok := strings.Cut(stderr.String(), "serving the dashboard on "); ok {
			u, _, _ := strings.Cut(rest, ";")
			return strings.TrimSuffix(u, "/"), stderr, stop
		}
		select {
		case code := <-done:
			t.Fatalf("serve exited %d: %s", code, stderr.String())
		case <-deadline:
			stop()
			t.Fatalf("serve did not start: %s", stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func TestServe(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	h := newHarness(t, true)
	tr := h.transport(pgtransport.Config{})
	h.publish(tr, "a", 0, 3)
	h.publish(tr, "b", 2, 4)

	base, stderr, stop := startServe(t, h)
	is.True(strings.HasPrefix(base, "http://127.0.0.1:")) // localhost by default
	is.True(strings.Contains(stderr.String(), "read-only: actions are off"))
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		is.NoErr(err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		is.NoErr(err)
		return resp.StatusCode, string(b)
	}
	code, body := get("/")
	is.Equal(code, 200)
	is.True(strings.Contains(body, `<b id="depth">7</b>`)) // the depth, rendered
	is.True(strings.Contains(body, "read-only"))
	// The JSON answers 503 until the sampler's first sample: wait for it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if code, body = get("/api/overview"); code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
	}
	is.Equal(code, 200)
	var o struct {
		Total struct{ Messages, Groups int64 }
	}
	is.NoErr(json.Unmarshal([]byte(body), &o))
	is.Equal(o.Total.Messages, int64(7))
	is.Equal(o.Total.Groups, int64(2))
	code, _ = get("/group?g=a")
	is.Equal(code, 200)
	code, _ = get("/group?g=nope")
	is.Equal(code, 404) // an unknown group
	resp, err := http.PostForm(base+"/action", url.Values{"do": {"pause"}, "group": {"a"}})
	is.NoErr(err)
	is.NoErr(resp.Body.Close())
	is.Equal(resp.StatusCode, http.StatusForbidden) // actions are off
	is.Equal(stop(), 0)                             // Ctrl-C: a clean stop

	base, stderr, stop = startServe(t, h, "--allow-actions", "--interval", "500ms")
	is.True(strings.Contains(stderr.String(), "actions ON"))
	code, body = get("/confirm?do=pause&group=a")
	is.Equal(code, 200)
	is.True(strings.Contains(body, `name="token"`)) // the confirmation form
	is.Equal(stop(), 0)
}

func TestServeUsage(t *testing.T) {
	t.Parallel()
	h := newHarness(t, true)
	h.fails(exitUsage, "", []string{"serve", "--interval", "0s"}, "--interval")
	h.fails(exitUsage, "", []string{"serve", "--addr", "127.0.0.1:99999"}, "--addr")
	h.fails(exitUsage, "", []string{"serve", "--addr", "nocolon"}, "--addr")
	// A port in use is a failure to run, not bad input: exit 1.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	h.fails(exitFailed, "", []string{"serve", "--addr", busy.Addr().String()}, "--addr", "address already in use")
}
