// Package archtest holds ARCHITECTURE.md to the code. It has no code of its own; its tests
// compare the dependency table with the imports the go tool reports, and check that the Go
// names and files the page mentions exist, so that the page cannot drift unnoticed.
//
// The tests run with "go test ./internal/archtest/" and skip when no go tool is on PATH.
package archtest
