module github.com/leapflow/leapflow/dashboard

go 1.26.0

replace github.com/leapflow/leapflow => ../

require (
	github.com/chromedp/chromedp v0.23.0
	github.com/leapflow/leapflow v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	github.com/chromedp/cdproto v0.159.0 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	gopkg.in/natefinch/lumberjack.v2 v2.2.1 // indirect
)
