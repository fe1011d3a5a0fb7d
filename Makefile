GO ?= go

.PHONY: test vet fmt-check bench

# test is the one command CI runs (.ci/run): static checks, then every test
# with the race detector.
test: vet fmt-check
	$(GO) test -race -count=1 ./...

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

# bench runs the benchmarks of every package, 5 times each, for benchstat.
bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 200ms -count 5 ./...
