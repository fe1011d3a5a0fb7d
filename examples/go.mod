module github.com/leapflow/leapflow/examples

go 1.26.0

replace github.com/leapflow/leapflow => ../

replace github.com/leapflow/leapflow/grpcflow => ../grpcflow

replace github.com/leapflow/leapflow/dashboard => ../dashboard

require (
	github.com/chromedp/chromedp v0.23.0
	github.com/leapflow/leapflow v0.0.0-00010101000000-000000000000
	github.com/leapflow/leapflow/dashboard v0.0.0-00010101000000-000000000000
	github.com/leapflow/leapflow/grpcflow v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/chromedp/cdproto v0.159.0 // indirect
	github.com/felixge/httpsnoop v1.1.0 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c // indirect
	gopkg.in/natefinch/lumberjack.v2 v2.2.1 // indirect
)
