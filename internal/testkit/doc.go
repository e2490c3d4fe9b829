// Package testkit holds what only tests use: pgtest (a test database,
// partitions, proxies, poolers and standbys started when absent), contract
// (the behaviour cases every front-end runs, on one database and on
// partitions), workertest (the handler runtimes' cases) and history (the
// fault tests and their linearizability checker). Shipped code never
// imports it: TestShippedCodeImportsNoTestkit fails the build if it does.
package testkit
