GO ?= go
# Root installs directly; anyone else goes through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test deps vet fmt-check tidy-check bench screenshot

# test is the one command CI runs (.ci/run): it installs what the tests
# need, runs the static checks, then every test with the race detector.
test: deps vet fmt-check tidy-check
	$(GO) test -race -count=1 ./...

# deps installs from Debian's packages what the tests need when missing:
# redis-server (and redis-cli), whose real servers the global package's
# tests start, and chromium, the headless browser the dashboard's page is
# tested in. Those tests fail without them.
deps:
	@missing=""; \
	if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then missing="redis-server redis-tools"; fi; \
	if ! command -v chromium >/dev/null 2>&1; then missing="$$missing chromium"; fi; \
	if [ -n "$$missing" ]; then \
		echo "installing from Debian's packages:$$missing"; \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi
	@redis-server --version
	@chromium --version 2>/dev/null || command -v chromium

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

# tidy-check fails when go.mod or go.sum is not what go mod tidy makes.
tidy-check:
	$(GO) mod tidy -diff

# bench runs the benchmarks of every package, 5 times each, for benchstat.
bench: deps
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 200ms -count 5 ./...

# screenshot regenerates docs/dashboard.png from the dashboard demo.
screenshot: deps
	$(GO) run ./examples/dashboard -addr 127.0.0.1:0 -screenshot docs/dashboard.png
