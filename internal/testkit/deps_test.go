package testkit_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/matryer/is"
)

const testkit = "github.com/pgtransport/pgtransport/internal/testkit"

// TestShippedCodeImportsNoTestkit fails when a package that ships (any
// package of the library or of the nested modules, tests aside) depends
// on internal/testkit, directly or through another package. The bench
// module is not shipped: it may use the test database helpers.
func TestShippedCodeImportsNoTestkit(t *testing.T) {
	is := is.New(t)
	root, err := filepath.Abs("../..")
	is.NoErr(err) // the module root
	for _, mod := range []string{".", "metrics", "cmd/pgtransport"} {
		cmd := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "./...")
		cmd.Dir = filepath.Join(root, mod)
		out, err := cmd.CombinedOutput()
		is.NoErr(err) // go list (see the output above)
		if err != nil {
			t.Log(string(out))
		}
		for line := range strings.Lines(string(out)) {
			pkg, deps, _ := strings.Cut(strings.TrimSpace(line), " ")
			if strings.HasPrefix(pkg, testkit) {
				continue
			}
			for dep := range strings.FieldsSeq(deps) {
				if strings.HasPrefix(dep, testkit) {
					t.Errorf("%s (module %s) depends on %s: test support must stay out of shipped code", pkg, mod, dep)
				}
			}
		}
	}
}
