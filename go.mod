module github.com/leapflow/leapflow

go 1.26

require (
	github.com/stretchr/testify v1.12.1
	go.uber.org/atomic v1.12.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
