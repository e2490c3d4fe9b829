package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/pgtransport/pgtransport/schema"
)

const (
	libraryModule = "github.com/pgtransport/pgtransport"
	metricsModule = "github.com/pgtransport/pgtransport/metrics"
)

func (a *app) versionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the versions this command was built from, and its schema version",
		Long: `version prints the module versions this binary was built from, as Go
recorded them in it (the command's, the library's and metrics'), and the
schema version it applies; it connects to nothing. A binary installed with
go install ...@vX.Y.Z shows vX.Y.Z; one built from a checkout shows
(devel) and the replace lines it was built with. migrate version compares
the schema version with the one recorded in a database.`,
		Args: a.exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			v := buildVersions(debug.ReadBuildInfo())
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), v)
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "command: %s\nlibrary: %s\nmetrics: %s\nschema:  %d\n", v.Command, v.Library, v.Metrics, v.Schema)
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: {command, library, metrics, schema}")
	return cmd
}

// versions is what version prints.
type versions struct {
	Command string `json:"command"`
	Library string `json:"library"`
	Metrics string `json:"metrics"`
	Schema  int    `json:"schema"`
}

// buildVersions reads the module versions from the build info
// (debug.ReadBuildInfo's results); "unknown" where there is none.
func buildVersions(bi *debug.BuildInfo, ok bool) versions {
	v := versions{Command: "unknown", Library: "unknown", Metrics: "unknown", Schema: schema.Version()}
	if !ok {
		return v
	}
	v.Command = moduleVersion(&bi.Main)
	for _, d := range bi.Deps {
		switch d.Path {
		case libraryModule:
			v.Library = moduleVersion(d)
		case metricsModule:
			v.Metrics = moduleVersion(d)
		}
	}
	return v
}

// moduleVersion is m's version, and what replaced it, as go version -m
// shows them ("v0.0.0 => ../.." from a checkout).
func moduleVersion(m *debug.Module) string {
	if m.Replace == nil {
		return m.Version
	}
	r := m.Replace.Path
	if m.Replace.Version != "" {
		r += " " + m.Replace.Version
	}
	return m.Version + " => " + r
}
