# pgtransport. `make help` lists the targets.
GO ?= go
BENCHTIME ?= 1s
BENCHCOUNT ?= 3

.PHONY: help test schema bench fmt vet

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'

test: vet ## vet, then every test under the race detector, on a real PostgreSQL
	$(GO) test -race -count=1 -timeout 20m ./...

vet: ## go vet and a gofmt check
	$(GO) vet ./...
	@test -z "$$(gofmt -l . | grep -v '^testdata/')" || { gofmt -l .; echo "gofmt needed"; exit 1; }

schema: ## print the complete SQL script (default names) to stdout
	@$(GO) run ./internal/cmd/schemasql

bench: ## run the benchmarks (BENCHTIME, BENCHCOUNT) and print msgs/s
	$(GO) test -run '^$$' -bench . -benchtime=$(BENCHTIME) -count=$(BENCHCOUNT) ./bench/

fmt: ## gofmt the tree
	gofmt -w .
