// Package control is flowd's NATS control plane: the NATS connection (an embedded
// nats-server by default, or an existing NATS cluster), the publisher of broker events as
// CloudEvents, and the command service.
//
// # Subjects
//
// Events are published on flowd.evt.<cluster>.<kind>.<event> (see Publisher and
// docs/control.md); commands are requests on subjects under flowd.ctl whose last token is
// the command's verb. The verbs in ReadOnlyVerbs only read state, so the "read" role of the
// embedded server may send them; every other verb needs the "admin" role.
//
// # Lifecycle
//
// Open starts the embedded server (or connects to the configured URLs) and owns both;
// StartPublisher subscribes to the broker's events and publishes them on the connection.
// At shutdown the daemon calls Publisher.Stopping, stops the broker, then Publisher.Close
// and NATS.Close, so the "stopping" event and every event the broker raised while it
// stopped leave before the connection drains and the server goes away.
package control
