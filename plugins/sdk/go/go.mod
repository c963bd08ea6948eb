module github.com/flowd-io/flowd/plugins/sdk/go

go 1.24
