module github.com/leapflow/leapflow/chiflow

go 1.26.0

replace github.com/leapflow/leapflow => ../

require (
	github.com/go-chi/chi/v5 v5.5.0
	github.com/leapflow/leapflow v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/felixge/httpsnoop v1.1.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
