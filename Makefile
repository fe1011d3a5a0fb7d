GO ?= go
# Root installs directly; anyone else goes through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test deps vet fmt-check tidy-check bench

# test is the one command CI runs (.ci/run): it installs what the tests
# need, runs the static checks, then every test with the race detector.
test: deps vet fmt-check tidy-check
	$(GO) test -race -count=1 ./...

# deps installs redis-server (and redis-cli) from Debian's packages when
# missing. The global package's tests start real servers and fail without.
deps:
	@if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then \
		echo "installing redis-server from Debian's packages"; \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends redis-server redis-tools; \
	fi
	@redis-server --version

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
