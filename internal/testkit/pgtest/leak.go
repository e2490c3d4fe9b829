package pgtest

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// MainNoLeaks is Main that also fails the run if, once the tests pass, a
// goroutine is still running code from any of pkgs (import paths, e.g.
// "github.com/pgtransport/pgtransport/async"). Goroutines get 5 s to end.
func MainNoLeaks(m *testing.M, pkgs ...string) { runNoLeaks(m, pkgs, func() {}) }

// runNoLeaks is MainNoLeaks, with after run once the package has.
func runNoLeaks(m *testing.M, pkgs []string, after func()) {
	code := m.Run()
	after()
	if code == 0 {
		if leak := Leaked(5*time.Second, pkgs...); leak != "" {
			fmt.Fprintf(os.Stderr, "goroutines leaked:\n%s\n", leak)
			code = 1
		}
	}
	Shutdown()
	os.Exit(code)
}

// Leaked waits up to wait for every goroutine running code from pkgs to
// end, and returns the stacks of those that did not ("" if none).
func Leaked(wait time.Duration, pkgs ...string) string {
	deadline := time.Now().Add(wait)
	for {
		var leaks []string
		buf := make([]byte, 1<<20)
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				buf = buf[:n]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		for _, g := range strings.Split(string(buf), "\n\n") {
			for _, p := range pkgs {
				// "pkg." is a function of pkg itself, not of pkg_test or a subpackage.
				if strings.Contains(g, p+".") {
					leaks = append(leaks, g)
					break
				}
			}
		}
		if len(leaks) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(leaks, "\n\n")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
