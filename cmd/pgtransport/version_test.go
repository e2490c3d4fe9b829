package main

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/pgtransport/pgtransport/schema"
)

func TestBuildVersions(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	released := &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/pgtransport/pgtransport/cmd/pgtransport", Version: "v1.2.3"},
		Deps: []*debug.Module{
			{Path: "github.com/spf13/cobra", Version: "v1.10.2"},
			{Path: libraryModule, Version: "v1.2.3"},
			{Path: metricsModule, Version: "v1.2.0"},
		},
	}
	is.Equal(buildVersions(released, true), versions{"v1.2.3", "v1.2.3", "v1.2.0", schema.Version()}) // go install ...@v1.2.3

	checkout := &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/pgtransport/pgtransport/cmd/pgtransport", Version: "(devel)"},
		Deps: []*debug.Module{
			{Path: libraryModule, Version: "v0.0.0", Replace: &debug.Module{Path: "../..", Version: "(devel)"}},
			{Path: metricsModule, Version: "v0.0.0", Replace: &debug.Module{Path: "example.com/fork/metrics", Version: "v1.0.1"}},
		},
	}
	is.Equal(buildVersions(checkout, true), versions{"(devel)", "v0.0.0 => ../.. (devel)", "v0.0.0 => example.com/fork/metrics v1.0.1", schema.Version()}) // built from a checkout

	is.Equal(buildVersions(nil, false), versions{"unknown", "unknown", "unknown", schema.Version()}) // no build info
}

func TestVersion(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	var out, errb strings.Builder
	e := &env{stdout: &out, stderr: &errb, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
	is.Equal(run(context.Background(), []string{"version"}, e), 0) // version needs no database
	is.Equal(errb.String(), "")
	want := buildVersions(debug.ReadBuildInfo())
	for _, line := range []string{"command: " + want.Command, "library: " + want.Library, "metrics: " + want.Metrics, "schema:  " + fmt.Sprint(schema.Version())} {
		is.True(strings.Contains(out.String(), line+"\n")) // version prints each module's line
	}

	out.Reset()
	is.Equal(run(context.Background(), []string{"version", "--json"}, e), 0) // version --json
	var got versions
	is.NoErr(json.Unmarshal([]byte(out.String()), &got)) // one JSON document
	is.Equal(got, want)
}
