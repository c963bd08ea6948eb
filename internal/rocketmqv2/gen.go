// Package rocketmqv2 is the generated Go code of RocketMQ 5's gRPC protocol (package
// apache.rocketmq.v2: the MessagingService and its messages) from the .proto files under
// proto/. The generated files are committed; TestGeneratedCodeIsCurrent regenerates them
// where protoc and the pinned generators are installed and compares.
package rocketmqv2

// The generators are pinned (protoc-gen-go at google.golang.org/protobuf's version in go.mod,
// protoc-gen-go-grpc v1.5.1); .ci/run installs them.
//go:generate protoc -I proto --go_out=. --go_opt=module=github.com/flowd-io/flowd/internal/rocketmqv2 --go_opt=Mapache/rocketmq/v2/definition.proto=github.com/flowd-io/flowd/internal/rocketmqv2;rocketmqv2 --go_opt=Mapache/rocketmq/v2/service.proto=github.com/flowd-io/flowd/internal/rocketmqv2;rocketmqv2 --go-grpc_out=. --go-grpc_opt=module=github.com/flowd-io/flowd/internal/rocketmqv2 --go-grpc_opt=Mapache/rocketmq/v2/definition.proto=github.com/flowd-io/flowd/internal/rocketmqv2;rocketmqv2 --go-grpc_opt=Mapache/rocketmq/v2/service.proto=github.com/flowd-io/flowd/internal/rocketmqv2;rocketmqv2 apache/rocketmq/v2/definition.proto apache/rocketmq/v2/service.proto
