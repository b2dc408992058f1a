module github.com/tent-dev/tent

go 1.26.0

require (
	github.com/google/btree v1.1.3
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/mattn/go-pointer v0.0.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
