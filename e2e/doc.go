// Package e2e tests flowd end to end: it builds the flowd binary once and runs it as child
// processes, each with its own configuration file, data directory and free 127.0.0.1 ports,
// driven with the binary's own client commands (topic, plugin, pipeline, group, produce,
// consume) and observed over NATS and HTTP. The package has no code of its own; its tests
// cover what in-process tests cannot: signals (SIGHUP reload, SIGTERM drain, SIGKILL),
// restarts on the same data directory, several daemons sharing a pipeline's consumer group,
// three nodes forming one cluster (shared topics and routes, a killed node leaving them, a
// node with a broker name already in the cluster refused, a Wasm filter deployed once and
// run by every node), plugins that never return (the
// daemon must keep serving and stop on SIGTERM), and the exit status and messages of the
// command line.
//
// The tests run with "go test ./e2e/"; the binary is built without -race whatever the
// test's flags, so that a run stays quick.
package e2e
