package rocketmqv2

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// generator finds a code generator on PATH or in GOPATH/bin (where go install puts it).
func generator(t *testing.T, name string) (string, bool) {
	if p, err := exec.LookPath(name); err == nil {
		return p, true
	}
	gopath, err := exec.Command("go", "env", "GOPATH").Output()
	if err != nil {
		return "", false
	}
	p := filepath.Join(strings.TrimSpace(string(gopath)), "bin", name)
	if runtime.GOOS == "windows" {
		p += ".exe"
	}
	if _, err := os.Stat(p); err != nil {
		return "", false
	}
	return p, true
}

// TestGeneratedCodeIsCurrent regenerates the Go code from proto/ with the go:generate line's
// arguments into a temporary directory and compares it byte for byte with what is committed,
// so that the .proto files and the generated code cannot drift apart.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	var paths []string
	for _, name := range []string{"protoc", "protoc-gen-go", "protoc-gen-go-grpc"} {
		p, ok := generator(t, name)
		if !ok {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed: .ci/run installs it", name)
			}
			t.Skipf("%s is not installed", name)
		}
		paths = append(paths, p)
	}
	src, err := os.ReadFile("gen.go")
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, line := range strings.Split(string(src), "\n") {
		if rest, ok := strings.CutPrefix(line, "//go:generate protoc "); ok {
			args = strings.Fields(rest)
		}
	}
	if len(args) == 0 {
		t.Fatal("gen.go has no //go:generate protoc line")
	}
	out := t.TempDir()
	for i, a := range args {
		// Both output options name the current directory; send them to the temporary one.
		if a == "--go_out=." || a == "--go-grpc_out=." {
			args[i] = strings.TrimSuffix(a, ".") + out
		}
	}
	args = append(args,
		"--plugin=protoc-gen-go="+paths[1],
		"--plugin=protoc-gen-go-grpc="+paths[2])
	cmd := exec.Command(paths[0], args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, b)
	}
	for _, name := range []string{"definition.pb.go", "service.pb.go", "service_grpc.pb.go"} {
		want, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatalf("protoc did not write %s: %v", name, err)
		}
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what protoc generates from proto/: run go generate ./internal/rocketmqv2", name)
		}
	}
}
