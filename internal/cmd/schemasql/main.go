// Command schemasql prints the complete schema script (default names, the
// current schema) to stdout, for `make schema` and teams that run their own
// migration tool: psql -v ON_ERROR_STOP=1 -f schema.sql. With -proxy it
// prints a PL/Proxy proxy database's script instead (`make proxy-schema`).
package main

import (
	"flag"
	"fmt"

	"github.com/pgtransport/pgtransport/schema"
)

func main() {
	proxy := flag.Bool("proxy", false, "print the proxy database's script (schema.ProxySQL)")
	flag.Parse()
	if *proxy {
		fmt.Print(schema.ProxySQL())
		return
	}
	fmt.Print(schema.SQL())
}
