# pgtransport. `make help` lists the targets.
GO ?= go
RESULTS ?= results
BENCHTIME ?= 1s
BENCHCOUNT ?= 3
FUZZTIME ?= 10m
# Nested modules with their own go.mod (dependencies the library's go.mod
# must not carry): tested, vetted and tidied with the library.
MODULES = metrics cmd/pgtransport internal/cmd/modproxy

.PHONY: help test schema proxy-schema bench bench-full bench-long bench-go bench-stats held-snapshot held-snapshot-paced failover fuzz fmt vet tidy release-check

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

test: tidy vet ## vet, every test under the race detector on a real PostgreSQL (library, metrics, command), and a short fuzz pass
	$(GO) test -race -count=1 -timeout 20m ./...
	for m in $(MODULES); do (cd $$m && $(GO) test -race -count=1 -timeout 10m ./...) || exit 1; done
	$(GO) test -run '^$$' -fuzz '^FuzzPublish$$' -fuzztime 10s ./sync

fuzz: ## fuzz publish for FUZZTIME (default 10m)
	$(GO) test -run '^$$' -fuzz '^FuzzPublish$$' -fuzztime $(FUZZTIME) ./sync

vet: ## go vet (library, bench and nested modules) and a gofmt check
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done
	@test -z "$$(gofmt -l . | grep -v '^testdata/')" || { gofmt -l .; echo "gofmt needed"; exit 1; }

schema: ## print the complete SQL script (default names) to stdout
	@$(GO) run ./internal/cmd/schemasql

proxy-schema: ## print the script of a PL/Proxy proxy database over partitions (docs/protocol.md, "Partitions") to stdout
	@$(GO) run ./internal/cmd/schemasql -proxy

bench: ## the headline, about 2 minutes: claim+ack of both transports against River and the old design, the handler runtimes; table, CSV and SVG chart in $(RESULTS)/
	cd bench && $(GO) run . -only '^(commits|claimack|river|runtime)$$' -out $(abspath $(RESULTS))

bench-full: ## every suite (hot group, publish, jobs, claim cost, claim walk, fairness, latency, poison, dedup, worktx, proxy, partitions too), about 9 minutes
	cd bench && $(GO) run . -out $(abspath $(RESULTS))

bench-long: ## every suite with longer runs and more of them
	cd bench && $(GO) run . -full -out $(abspath $(RESULTS))

bench-stats: ## the operator's reads (Stats, Groups, Peek) at 1,000,000 groups and 10,000,000 messages, about 5 minutes
	cd bench && $(GO) run . -only '^stats$$' -out $(abspath $(RESULTS))

held-snapshot: ## the async load (64 in flight, 10,000 groups) for 7 minutes on a throwaway cluster (autovacuum on) while another session holds a snapshot for the first 5: throughput per minute, table sizes and dead rows
	cd bench && $(GO) run . -sustained 7m -hold 5m -cluster

held-snapshot-paced: ## a publisher paced at 1,000 msgs/s over 10,000 groups into one stream (LISTEN wake-ups on) for 35 minutes on a throwaway cluster (autovacuum on) while another session holds a snapshot for the first 30: pickup p50/p99, rate and table sizes every 10 s
	cd bench && $(GO) run . -sustained 35m -hold 30m -cluster -rate 1000

failover: ## primary/standby failover at length: 5 runs each of sync replication, async with a lagging standby, and a hung primary; about 10 min
	PGTRANSPORT_FAILOVER_RUNS=5 PGTRANSPORT_FAILOVER_ASYNC=1 PGTRANSPORT_FAILOVER_FROZEN=1 PGTRANSPORT_FAULT_SCALE=3 $(GO) test -run '^TestFailover' -count=1 -v -timeout 30m ./internal/testkit/history/

bench-go: ## the go test benchmarks in bench/ (BENCHTIME, BENCHCOUNT)
	cd bench && $(GO) test -run '^$$' -bench . -benchtime=$(BENCHTIME) -count=$(BENCHCOUNT) .

tidy: ## fail when go mod tidy would change go.mod or go.sum (library, bench and nested modules)
	$(GO) mod tidy -diff
	cd bench && $(GO) mod tidy -diff
	for m in $(MODULES); do (cd $$m && $(GO) mod tidy -diff) || exit 1; done

fmt: ## gofmt the tree
	gofmt -w .

release-check: ## rehearse docs/release.md offline: go install the command at a made-up version from a file:// module proxy, no replace lines (well under a minute)
	.ci/release-check
