// Command modproxy adds one version of a module, zipped from a directory,
// to a module proxy on disk (GOPROXY=file://DIR): the files
// DIR/<module>/@v/{list,<version>.info,<version>.mod,<version>.zip} that
// `go mod download` reads. make release-check (.ci/release-check) serves
// the library, metrics and the command from one to prove docs/release.md's
// steps without publishing anything.
//
// The zip is golang.org/x/mod/zip's, the code the go command itself uses
// to check and extract module zips: it leaves out nested modules, vendor
// directories and VCS metadata, prefixes every name with module@version/,
// and enforces the go command's file-name and size rules. A hand-written
// zip would have to copy those rules, and would differ from the one the
// public proxy builds from a tag exactly where a release breaks.
//
// It is a module of its own so that golang.org/x/mod stays out of the
// library's go.mod.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

func main() {
	var m module.Version
	var dir, out string
	flag.StringVar(&m.Path, "module", "", "the module's path")
	flag.StringVar(&m.Version, "version", "", "the version to serve it at (semver, e.g. v0.0.0-releasecheck)")
	flag.StringVar(&dir, "dir", "", "the module's directory (holding its go.mod)")
	flag.StringVar(&out, "out", "", "the proxy's directory")
	flag.Parse()
	if m.Path == "" || m.Version == "" || dir == "" || out == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := add(m, dir, out); err != nil {
		fmt.Fprintf(os.Stderr, "modproxy: %s@%s: %v\n", m.Path, m.Version, err)
		os.Exit(1)
	}
}

// add writes m, zipped from dir, into the proxy at out.
func add(m module.Version, dir, out string) error {
	if err := module.Check(m.Path, m.Version); err != nil {
		return err
	}
	escPath, err := module.EscapePath(m.Path)
	if err != nil {
		return err
	}
	escVersion, err := module.EscapeVersion(m.Version)
	if err != nil {
		return err
	}
	vdir := filepath.Join(out, filepath.FromSlash(escPath), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	base := filepath.Join(vdir, escVersion)

	z, err := os.Create(base + ".zip")
	if err != nil {
		return err
	}
	if err := zip.CreateFromDir(z, m, dir); err != nil {
		z.Close()
		return err
	}
	if err := z.Close(); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(base+".mod", gomod, 0o644); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{m.Version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	if err := os.WriteFile(base+".info", info, 0o644); err != nil {
		return err
	}
	return addToList(filepath.Join(vdir, "list"), m.Version)
}

// addToList adds version to the proxy's list of the module's versions.
func addToList(list, version string) error {
	b, err := os.ReadFile(list)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	versions := strings.Fields(string(b))
	if slices.Contains(versions, version) {
		return nil
	}
	versions = append(versions, version)
	return os.WriteFile(list, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}
