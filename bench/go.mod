module github.com/leapflow/leapflow/bench

go 1.26.0

replace github.com/leapflow/leapflow => ../

replace github.com/leapflow/leapflow/global => ../global

replace github.com/leapflow/leapflow/grpcflow => ../grpcflow

require (
	github.com/go-redis/redis_rate/v10 v10.0.1
	github.com/leapflow/leapflow v0.0.0-00010101000000-000000000000
	github.com/leapflow/leapflow/global v0.0.0-00010101000000-000000000000
	github.com/leapflow/leapflow/grpcflow v0.0.0-00010101000000-000000000000
	github.com/redis/go-redis/v9 v9.23.0
	github.com/schollz/progressbar/v3 v3.19.1
	github.com/sethvargo/go-limiter v0.7.1
	github.com/sony/gobreaker/v2 v2.4.0
	github.com/stretchr/testify v1.12.1
	github.com/ulule/limiter/v3 v3.11.2
	go.uber.org/atomic v1.12.0
	go.uber.org/ratelimit v0.3.1
	golang.org/x/time v0.16.0
	google.golang.org/grpc v1.85.0
)

require (
	github.com/benbjohnson/clock v1.3.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/felixge/httpsnoop v1.1.0 // indirect
	github.com/maypok86/otter/v2 v2.4.0 // indirect
	github.com/mitchellh/colorstring v0.0.0-20190213212951-d06e56a500db // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/rivo/uniseg v0.4.7 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/term v0.46.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
