// Command schemasql prints the complete schema script (default names, the
// current schema) to stdout, for `make schema` and teams that run their own
// migration tool: psql -v ON_ERROR_STOP=1 -f schema.sql.
package main

import (
	"fmt"

	"github.com/pgtransport/pgtransport/schema"
)

func main() { fmt.Print(schema.SQL()) }
