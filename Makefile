# pgtransport. `make help` lists the targets.
GO ?= go
RESULTS ?= results
BENCHTIME ?= 1s
BENCHCOUNT ?= 3
FUZZTIME ?= 10m

.PHONY: help test schema bench bench-full bench-go fuzz fmt vet tidy

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

test: tidy vet ## vet, every test under the race detector on a real PostgreSQL, and a short fuzz pass
	$(GO) test -race -count=1 -timeout 20m ./...
	$(GO) test -run '^$$' -fuzz '^FuzzPublish$$' -fuzztime 10s ./sync

fuzz: ## fuzz publish for FUZZTIME (default 10m)
	$(GO) test -run '^$$' -fuzz '^FuzzPublish$$' -fuzztime $(FUZZTIME) ./sync

vet: ## go vet (library and bench module) and a gofmt check
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	@test -z "$$(gofmt -l . | grep -v '^testdata/')" || { gofmt -l .; echo "gofmt needed"; exit 1; }

schema: ## print the complete SQL script (default names) to stdout
	@$(GO) run ./internal/cmd/schemasql

bench: ## pgtransport vs the old design vs River, poison messages and dedup, about 4 minutes: table, CSV and SVG chart in $(RESULTS)/
	cd bench && $(GO) run . -out $(abspath $(RESULTS))

bench-full: ## the same, longer runs and more of them
	cd bench && $(GO) run . -full -out $(abspath $(RESULTS))

bench-go: ## the go test benchmarks in bench/ (BENCHTIME, BENCHCOUNT)
	cd bench && $(GO) test -run '^$$' -bench . -benchtime=$(BENCHTIME) -count=$(BENCHCOUNT) .

tidy: ## fail when go mod tidy would change go.mod or go.sum (library and bench module)
	$(GO) mod tidy -diff
	cd bench && $(GO) mod tidy -diff

fmt: ## gofmt the tree
	gofmt -w .
