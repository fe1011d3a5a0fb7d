GO ?= go
# Root installs directly; anyone else goes through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test deps vet fmt-check tidy-check modules-check bench screenshot

# MODULES are the repository's modules, the ones go.work uses: the root
# (flow and what a user of flow gets with it) and one module per
# integration that brings heavy dependencies (see docs/modules.md).
# vet, tidy-check, test and bench run in each in turn and stop at the first
# failure. vet and test run with GOWORK=off: each module is built from its
# own go.mod (its replace directives point at its neighbours in this tree),
# as its users build it.
MODULES := . global grpcflow promflow otelflow etcdflow chiflow ginflow echoflow fiberflow dashboard cmd/leapflow bench examples

# test is the one command CI runs (.ci/run): it installs what the tests
# need, runs the static checks, then every test of every module with the
# race detector.
test: deps vet fmt-check tidy-check
	@for m in $(MODULES); do \
		echo "go test -race -count=1 ./... in $$m"; \
		(cd $$m && GOWORK=off $(GO) test -race -count=1 ./...) || exit 1; \
	done

# deps installs from Debian's packages what the tests need when missing:
# redis-server (and redis-cli), whose real servers the global package's
# tests start, etcd-server, the etcd etcdflow's tests start, and chromium,
# the headless browser the dashboard's page is tested in. Those tests fail
# without them.
deps:
	@missing=""; \
	if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then missing="redis-server redis-tools"; fi; \
	if ! command -v etcd >/dev/null 2>&1; then missing="$$missing etcd-server"; fi; \
	if ! command -v chromium >/dev/null 2>&1; then missing="$$missing chromium"; fi; \
	if [ -n "$$missing" ]; then \
		echo "installing from Debian's packages:$$missing"; \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi
	@redis-server --version
	@etcd --version | head -1
	@chromium --version 2>/dev/null || command -v chromium

vet:
	@for m in $(MODULES); do \
		echo "go vet ./... in $$m"; \
		(cd $$m && GOWORK=off $(GO) vet ./...) || exit 1; \
	done

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

# tidy-check fails when a module's go.mod or go.sum is not what go mod tidy
# makes (tidy ignores go.work), or when MODULES misses a go.mod in the tree.
tidy-check: modules-check
	@for m in $(MODULES); do \
		echo "go mod tidy -diff in $$m"; \
		(cd $$m && $(GO) mod tidy -diff) || exit 1; \
	done

# modules-check fails when the go.mod files in the tree are not those of
# MODULES.
modules-check:
	@have=$$(find . -name go.mod -not -path '*/.*' | sed 's#/go.mod$$##' | sort); \
	want=$$(for m in $(MODULES); do echo $$m; done | sed 's#^\([^.]\)#./\1#' | sort); \
	if [ "$$have" != "$$want" ]; then echo "MODULES is not the tree's modules:"; echo "tree: $$have"; echo "MODULES: $$want"; exit 1; fi

# bench runs the benchmarks of every package of every module, 5 times
# each, for benchstat.
bench: deps
	@for m in $(MODULES); do \
		(cd $$m && $(GO) test -run '^$$' -bench . -benchmem -benchtime 200ms -count 5 ./...) || exit 1; \
	done

# screenshot regenerates docs/dashboard.png from the dashboard demo.
screenshot: deps
	$(GO) run ./examples/dashboard -addr 127.0.0.1:0 -screenshot docs/dashboard.png
