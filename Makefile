# Targets print what they run. `make` alone lists them.
# The targets that need servers and tools (test, test-race) first run
# scripts/servers.sh, which installs and starts PostgreSQL and RabbitMQ and
# installs promtool, Chromium, jq and apidiff where they are missing (as
# make dev does for the servers and apidiff, with the same script);
# .ci/run runs `make lint`, `make api-check` and `make test`.

GO            ?= go
# The pinned golangci-lint: `make lint` installs it into $(GOBIN) when
# the one on PATH is missing or another version.
GOLANGCI_LINT_VERSION := v2.15.0
GOBIN         ?= $(shell $(GO) env GOPATH)/bin
GOLANGCI_LINT ?= $(GOBIN)/golangci-lint
BIN           := bin
PKGS          := ./...
# -timeout is each test binary's hang guard, not a budget: every scenario
# bounds itself. The worker package's end-to-end tests take about 11
# minutes on a quiet 2-core host and more than 20 beside two busy loops.
TEST_FLAGS    ?= -count=1 -timeout 40m
# The packages whose goroutines share state (publisher, claimer, schedules,
# HTTP server, partition ownership, wake-up; the inbox is the public
# module's, below): make test runs them under the race detector too,
# but for the broker's container test, which only starts RabbitMQ 3.x and
# 4.x and runs the package again in another process: the first pass ran it.
RACE_PKGS     := ./broker/... ./claim/... ./schedule/... ./ops/... ./retention/... ./recovery/... ./ownership/... ./wake/...
# The module services import (events, events/inbox: docs/api.md), nested
# in events/ with a go.mod of its own. `./...` does not enter it: the
# targets below name it. Its tests need servers they cannot start (its
# go.mod holds no FerretDB), so scripts' TestPublicModule runs them with
# this suite's FerretDB and RabbitMQ, in `go test ./...` and, under the
# race detector, in the race pass.
PUBLIC_MODULE := events

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# bin/worker names its build (worker version, /status,
# outbox_build_info): the v* tag of HEAD, if any (else it says devel),
# the commit, -dirty with changes not committed, and the build date (UTC;
# SOURCE_DATE_EPOCH, when set, for a reproducible build). The linker
# stamps them, so that they hold whatever GOFLAGS says of -buildvcs; a
# release is stamped the same way by .goreleaser.yaml.
BUILDINFO     := github.com/outboxrelay/outbox/internal/buildinfo
VERSION       ?= $(shell git describe --tags --exact-match --match 'v*' 2>/dev/null)
REVISION      ?= $(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
BUILD_DATE    ?= $(shell date -u $(if $(SOURCE_DATE_EPOCH),-d @$(SOURCE_DATE_EPOCH)) +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS       := -X $(BUILDINFO).Version=$(VERSION) -X $(BUILDINFO).Revision=$(REVISION) -X $(BUILDINFO).BuildDate=$(BUILD_DATE)

.PHONY: build
build: ## Build all packages (the public module's too) and bin/worker (stamped with the v* tag of HEAD, if any, the commit and the build date)
	$(GO) build $(PKGS)
	cd $(PUBLIC_MODULE) && $(GO) build ./...
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/worker ./cmd/worker

.PHONY: servers
servers: ## Install and start PostgreSQL and RabbitMQ, install promtool, Chromium, jq and apidiff, where missing (scripts/servers.sh; needs root or passwordless sudo for what is missing)
	bash scripts/servers.sh

# deploy/'s tests run promtool on the alert rules and console/'s drive
# Chromium: with CI set they fail when the tool is missing, elsewhere they
# skip with a message; `servers` installs both first.
.PHONY: test
test: servers ## Run all tests (the public module's too), then the concurrent packages and the public module again under the race detector (ensures PostgreSQL, RabbitMQ, promtool, Chromium, jq and apidiff first)
	$(GO) test $(TEST_FLAGS) $(PKGS)
	$(GO) test -race $(TEST_FLAGS) -skip '^TestContainerRabbitMQVersions$$' $(RACE_PKGS)
	$(GO) test -race $(TEST_FLAGS) -run '^TestPublicModule$$' ./scripts/

.PHONY: test-race
test-race: servers ## Run all tests (the public module's too) with the race detector
	$(GO) test -race $(TEST_FLAGS) $(PKGS)

.PHONY: rules
rules: ## Check and unit-test the Prometheus alert rules (needs promtool), and regenerate the PrometheusRule
	cd deploy/prometheus && promtool check rules outbox-rules.yml && promtool test rules outbox-rules.test.yml
	$(GO) test -count=1 ./deploy -run TestPrometheusRule -update

.PHONY: vet
vet: ## Run go vet (on the public module too)
	$(GO) vet $(PKGS)
	cd $(PUBLIC_MODULE) && $(GO) vet ./...

.PHONY: fmt
fmt: ## Fail if any Go file needs gofmt
	@files="$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || find . -name '*.go' -not -path './vendor/*'))"; \
	if [ -n "$$files" ]; then \
		echo "these files need gofmt -w:"; echo "$$files"; exit 1; \
	fi; \
	echo "gofmt: ok"

.PHONY: lint
lint: vet fmt lint-tool ## Run go vet, the gofmt check and golangci-lint (the pinned version, installed if missing), on both modules
	$(GOLANGCI_LINT) run $(PKGS)
	cd $(PUBLIC_MODULE) && $(GOLANGCI_LINT) run ./...

.PHONY: lint-tool
lint-tool: ## Install golangci-lint $(GOLANGCI_LINT_VERSION) into $(GOBIN) unless it is there
	@if ! $(GOLANGCI_LINT) version 2>/dev/null | grep -q "version $(patsubst v%,%,$(GOLANGCI_LINT_VERSION)) "; then \
		echo "$(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)"; \
		GOBIN=$(GOBIN) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION); \
	fi

.PHONY: devdb
devdb: ## Run embedded FerretDB on 127.0.0.1:27017 for local development
	$(GO) run ./cmd/devdb

.PHONY: dev
dev: ## Run the local stack: devdb (FerretDB), RabbitMQ, 3 workers, demo producer and consumer; Ctrl-C stops it
	./scripts/dev.sh

.PHONY: up
up: ## Start the docker-compose stack (MongoDB replica set, RabbitMQ, 3 workers, producer, consumer)
	docker compose up --build

.PHONY: down
down: ## Stop the docker-compose stack and delete its volumes
	docker compose down -v

# BASELINE=<git rev> (a commit, branch or tag) also runs the
# slow-database stages, held-aggregates, large-docs and the starvation stages with the worker built from that
# rev, for before/after figures from the same run: `make bench
# BASELINE=main`. The rev is exported with git
# archive into a temporary folder and built there; the work tree is not
# touched.
BASELINE      ?=
BASELINE_BIN  := $(BIN)/worker-baseline
BASELINE_FLAG := $(if $(BASELINE),-baseline $(BASELINE_BIN))

.PHONY: bench
bench: $(if $(BASELINE),baseline-worker) ## Benchmark the worker on FerretDB + RabbitMQ (12 to 13 min, 16 to 17 with BASELINE=<rev>, which adds before/after); writes results/ (docs/performance.md)
	$(GO) build -o $(BIN)/worker ./cmd/worker
	$(GO) run ./cmd/bench -worker $(BIN)/worker -out results -doc docs/performance.md $(BASELINE_FLAG) $(BENCH_FLAGS)

.PHONY: bench-go
bench-go: ## Run the testing.B benchmarks of the hot code (message conversion, ordering keys, round planning, frame sizing, owners' and claim's reads; the reads need PostgreSQL)
	cd $(PUBLIC_MODULE) && $(GO) test -run '^$$' -bench . -benchmem .
	$(GO) test -run '^$$' -bench . -benchmem ./claim/ ./broker/ ./mongo/

.PHONY: console-screenshots
console-screenshots: ## Take the screenshots of docs/console.md, light and dark, with the console's browser test (needs chromium)
	OUTBOX_TEST_SCREENSHOTS=$(CURDIR)/docs/images $(GO) test -count=1 -run 'TestBrowser' ./console/

.PHONY: trace-picture
trace-picture: ## Draw docs/images/trace.svg from the spans a real worker exports in the OTLP end-to-end test (needs PostgreSQL and RabbitMQ)
	OUTBOX_TEST_TRACE_SVG=$(CURDIR)/docs/images/trace.svg $(GO) test -count=1 -run 'TestTracingOverOTLP' ./cmd/worker/

.PHONY: bench-doc
bench-doc: ## Rewrite the table in docs/performance.md (and results/bench.txt, bench.png) from results/bench.json
	$(GO) run ./cmd/bench -replot results/bench.json -doc docs/performance.md

.PHONY: bench-slow
bench-slow: $(if $(BASELINE),baseline-worker) ## Only the opt-in large-backlog stages (20,000 events, 20,000 beside two busy loops, 20,000 beside 30,000 skipped FAILED, 50,000; 55+ min on FerretDB); writes results/slow/
	$(GO) build -o $(BIN)/worker ./cmd/worker
	$(GO) run ./cmd/bench -worker $(BIN)/worker -out results/slow -only backlog-20k,backlog-20k-busy,backlog-20k-skipped,backlog-50k $(BASELINE_FLAG) $(BENCH_FLAGS)

.PHONY: baseline-worker
baseline-worker: ## Build bin/worker-baseline from BASELINE=<git rev>
	@test -n "$(BASELINE)" || { echo "set BASELINE=<git rev>, e.g. make baseline-worker BASELINE=main"; exit 1; }
	@mkdir -p $(BIN)
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	git archive --format=tar "$(BASELINE)" | tar -x -C "$$tmp" && \
	(cd "$$tmp" && $(GO) build -o "$(CURDIR)/$(BASELINE_BIN)" ./cmd/worker) && \
	echo "built $(BASELINE_BIN) from $(BASELINE) ($$(git rev-parse --short "$(BASELINE)^{commit}"))"

# The release tools, pinned; `go run` fetches and builds them. syft
# writes the archives' SBOMs (GoReleaser runs it from PATH):
# release-snapshot installs it into $(GOBIN) unless a syft of
# $(SYFT_VERSION) is there or on PATH (the workflow downloads it).
GORELEASER    := github.com/goreleaser/goreleaser/v2@v2.15.1
ACTIONLINT    := github.com/rhysd/actionlint/cmd/actionlint@v1.7.12
SYFT_VERSION  := v1.57.2
GOVULNCHECK   := golang.org/x/vuln/cmd/govulncheck@v1.10.0

.PHONY: release-check
release-check: ## Check the release configuration (goreleaser check), the GitHub workflows (actionlint) and the release records of CHANGELOG.md against the tags (needs a clone with history); CI runs it on every push
	$(GO) run $(GORELEASER) check
	$(GO) run $(ACTIONLINT) .github/workflows/*.yml
	bash scripts/release-notes.sh --check

.PHONY: release-snapshot
release-snapshot: syft-tool ## Build the release's archives, their SBOMs and checksums into dist/ without publishing, and check them (scripts/release-snapshot.sh); the image needs docker buildx and the signatures the workflow's identity
	PATH="$(GOBIN):$$PATH" $(GO) run $(GORELEASER) release --snapshot --clean --skip=docker,sign
	bash scripts/release-snapshot.sh dist

.PHONY: syft-tool
syft-tool: ## Install syft $(SYFT_VERSION) into $(GOBIN) unless it is there or on PATH
	@if go version -m "$(GOBIN)/syft" 2>/dev/null | grep -q "mod[[:space:]]*github.com/anchore/syft[[:space:]]*$(SYFT_VERSION)[[:space:]]" || \
		syft version 2>/dev/null | grep -q "^Version:[[:space:]]*$(patsubst v%,%,$(SYFT_VERSION))$$"; then \
		echo "syft $(SYFT_VERSION): installed"; \
	else \
		echo "$(GO) install github.com/anchore/syft/cmd/syft@$(SYFT_VERSION)"; \
		GOBIN=$(GOBIN) $(GO) install github.com/anchore/syft/cmd/syft@$(SYFT_VERSION); \
	fi

.PHONY: api-check
api-check: ## Compare the public module's API (events/) with the last release's (apidiff, pinned): fail on an incompatible change CHANGELOG.md's Unreleased section does not name under **Breaking** (scripts/api-check.sh; .ci/run runs it; needs the clone's history)
	bash scripts/api-check.sh

.PHONY: vulncheck
vulncheck: ## Report known vulnerabilities in the code's call graph and its modules, both modules (govulncheck, pinned; CI runs it)
	$(GO) run $(GOVULNCHECK) ./...
	cd $(PUBLIC_MODULE) && $(GO) run $(GOVULNCHECK) ./...

# ---------------------------------------------------------------------------
# Reserved for other owners; add each target with a `## ` help comment:
# ---------------------------------------------------------------------------

.PHONY: bench-starvation
bench-starvation: $(if $(BASELINE),baseline-worker) ## Only the opt-in starvation stages (4 replicas behind 50,000 paused events, then behind 5,000 held aggregates; many minutes on FerretDB); writes results/starvation/
	$(GO) build -o $(BIN)/worker ./cmd/worker
	$(GO) run ./cmd/bench -worker $(BIN)/worker -out results/starvation -only paused-head,held-head $(BASELINE_FLAG) $(BENCH_FLAGS)

# check-order runs for OUTBOX_TEST_CHECK_DURATION, 10m unless OUTBOX_TEST_CHECK_SEEDS
# bounds it instead (OUTBOX_TEST_CHECK_FROM: the first seed).
CHECK_ORDER_DURATION := $(or $(OUTBOX_TEST_CHECK_DURATION),$(if $(OUTBOX_TEST_CHECK_SEEDS),,10m))

.PHONY: check-order
check-order: ## Hunt interleavings of the ordered claim as long as asked (OUTBOX_TEST_CHECK_DURATION=10m or OUTBOX_TEST_CHECK_SEEDS=n), then the real store on FerretDB (OUTBOX_TEST_STORE_CHECK_SEEDS=20): prints seeds per minute, operations explored, the states the known holes need, and any failing seed
	OUTBOX_TEST_CHECK_DURATION=$(CHECK_ORDER_DURATION) $(GO) test -run TestInterleavingsChecker -count=1 -v -timeout 0 ./claim/plan/check/
	OUTBOX_TEST_STORE_CHECK_SEEDS=$(or $(OUTBOX_TEST_STORE_CHECK_SEEDS),20) $(GO) test -run TestInterleavingsChecker -count=1 -v -timeout 0 ./mongo/

.PHONY: bench-fleet
bench-fleet: ## Only the opt-in fleet stages (fleet-idle: 200 idle outboxes in 20 databases, commands/s, RSS per outbox, first-event wait; fleet-fair: 20 outboxes, one flooded; many minutes on FerretDB); writes results/fleet/
	$(GO) build -o $(BIN)/worker ./cmd/worker
	$(GO) run ./cmd/bench -worker $(BIN)/worker -out results/fleet -only fleet-idle,fleet-fair $(BENCH_FLAGS)
