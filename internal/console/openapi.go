package console

import (
	"net/http"
	"strings"

	"github.com/flowd-io/flowd/control"
)

// summary is what a command does, for the OpenAPI document; docs/control.md has the
// fields of every request and reply.
func summary(name string) string {
	switch name {
	case "topic.create":
		return "Create a topic: {topic, queues | read_queues, write_queues, perm, order}"
	case "topic.update":
		return "Change a topic's queue counts, permission or order: {topic, …}"
	case "topic.delete":
		return "Delete a topic, its consume queues and every group's offsets of it: {topic}"
	case "topic.list":
		return "Every topic, sorted by name"
	case "topic.describe":
		return "A topic and its queues (min and max offsets, last store time), messages and rate: {topic}"
	case "group.list":
		return "Every consumer group with its members, topics and lag"
	case "group.describe":
		return "A group's members, subscriptions, assignment, and committed offset and lag per queue: {group}"
	case "group.reset_offset":
		return "Move a group's offsets of a topic: {group, topic, to: earliest|latest | timestamp | offsets}"
	case "message.get":
		return "A message by its offset message id: {msg_id}"
	case "message.query":
		return "Messages of a topic by key or unique key: {topic, key, unique, begin, end, max}"
	case "message.browse":
		return "One queue's messages from an offset or a store time, a page at a time: {topic, queue, offset | timestamp, max, broker?}"
	case "message.search":
		return "Scan a topic's queues with a SQL92 expression or a deployed filter plugin, bounded and paged: {topic, sql92 | filter, queue?, from_offset | from_time | positions, to, max_scan, max_matches, timeout}"
	case "message.send":
		return "Store a test message as a producer's send would: {topic, body, tags, keys, properties, queue?}"
	case "broker.status":
		return "The broker: addresses, uptime, counts, store offsets and flush state"
	case "cluster.status":
		return "The cluster as this node sees it: live brokers, NATS routes and JetStream meta group"
	case "plugin.deploy":
		return "Validate and store a plugin version: {manifest, module (base64) | object, activate}"
	case "plugin.list":
		return "Every deployed plugin version and which is active: {name?}"
	case "plugin.activate":
		return "Activate a deployed version: {name, version}"
	case "plugin.remove":
		return "Remove a version that is not active: {name, version}"
	case "pipeline.list":
		return "Every pipeline's state, counters, queues and lag: {name?}"
	case "pipeline.pause":
		return "Pause a pipeline: {name}"
	case "pipeline.resume":
		return "Resume a paused pipeline: {name}"
	case "pipeline.seek":
		return "Move a pipeline's position: {name, position: first|last|timestamp|offset, …}"
	case "pipeline.create":
		return "Create a pipeline that every node of the cluster runs: {definition}"
	case "pipeline.delete":
		return "Delete a created pipeline on every node: {name}"
	}
	return "The " + name + " command of the NATS control plane"
}

func jsonContent(schema map[string]any) map[string]any {
	return map[string]any{"application/json": map[string]any{"schema": schema}}
}

// errorResponses are the answers every command may give besides 200.
func errorResponses() map[string]any {
	ref := map[string]any{"$ref": "#/components/schemas/Error"}
	out := map[string]any{}
	for code, what := range map[string]string{
		"400": "the request is not valid; the message names the field",
		"401": "no or wrong credentials",
		"403": "the admin role is needed, the command is disabled on this node, or a cross-origin change was refused",
		"404": "no such topic, group, message, plugin or pipeline, or no such command",
		"409": "a conflict: the topic exists, the version is active, the pipeline has stopped",
		"500": "the broker failed",
		"503": "no daemon answers: the command service is not running",
	} {
		out[code] = map[string]any{"description": what, "content": jsonContent(ref)}
	}
	return out
}

// openAPIDoc builds the OpenAPI 3.1 document of the API from the command table, so that
// it lists exactly the commands the daemon has.
func openAPIDoc(version string) map[string]any {
	obj := map[string]any{"type": "object"}
	paths := map[string]any{}
	for _, name := range control.Commands() {
		noun, verb, _ := strings.Cut(name, ".")
		ro := control.IsReadOnly(verb)
		op := func(method string) map[string]any {
			o := map[string]any{
				"operationId": strings.ReplaceAll(name, ".", "_") + "_" + method,
				"summary":     summary(name),
				"tags":        []string{noun},
				"responses": merge(errorResponses(), map[string]any{
					"200": map[string]any{"description": "the command's reply, as over NATS (docs/control.md)", "content": jsonContent(obj)},
				}),
				"x-flowd-role": map[bool]string{true: "read", false: "admin"}[ro],
				"x-flowd-nats": control.SubjectPrefix + ".<cluster>." + name,
			}
			if method == "post" {
				o["requestBody"] = map[string]any{"description": "the command's request, as over NATS", "content": jsonContent(obj)}
			} else {
				o["description"] = "The request's fields as query parameters (true, false and integers are read as JSON values)."
			}
			return o
		}
		item := map[string]any{"post": op("post")}
		if ro {
			item["get"] = op("get")
		}
		paths["/api/v1/"+noun+"/"+verb] = item
	}
	paths["/api/v1/events"] = map[string]any{"get": map[string]any{
		"operationId": "events", "summary": "The broker's events as Server-Sent Events; ?kinds=topic,group keeps some kinds",
		"tags": []string{"events"}, "x-flowd-role": "read",
		"parameters": []any{map[string]any{"name": "kinds", "in": "query", "schema": map[string]any{"type": "string"}}},
		"responses":  map[string]any{"200": map[string]any{"description": "id: <ce-id>, data: {type: <kind>.<event>, id, subject, source, time, data}", "content": map[string]any{"text/event-stream": map[string]any{}}}},
	}}
	paths["/api/v1/stats"] = map[string]any{"get": map[string]any{
		"operationId": "stats", "summary": "Every topic's messages and rate, every group's lag and members (the service's STATS data)",
		"tags": []string{"broker"}, "x-flowd-role": "read", "responses": merge(errorResponses(), map[string]any{"200": map[string]any{"description": "stats", "content": jsonContent(obj)}}),
	}}
	paths["/api/v1/commands"] = map[string]any{"get": map[string]any{
		"operationId": "commands", "summary": "Every command, whether it only reads, and whether the caller may send it",
		"tags": []string{"session"}, "x-flowd-role": "read", "responses": map[string]any{"200": map[string]any{"description": "commands", "content": jsonContent(obj)}},
	}}
	paths["/api/v1/session"] = map[string]any{
		"get": map[string]any{"operationId": "session_get", "summary": "Who the caller is: user, role, and whether the console asks for credentials",
			"tags": []string{"session"}, "responses": map[string]any{"200": map[string]any{"description": "session", "content": jsonContent(obj)}}},
		"post": map[string]any{"operationId": "session_create", "summary": "Sign in with {token} or {user, password}: sets the session cookie",
			"tags": []string{"session"}, "requestBody": map[string]any{"content": jsonContent(obj)},
			"responses": map[string]any{"200": map[string]any{"description": "signed in", "content": jsonContent(obj)}, "401": map[string]any{"description": "wrong credentials"}}},
		"delete": map[string]any{"operationId": "session_delete", "summary": "Sign out", "tags": []string{"session"},
			"responses": map[string]any{"204": map[string]any{"description": "signed out"}}},
	}
	return map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{"title": "flowd console API", "version": version,
			"description": "The flowd control plane over HTTP: every command of the NATS command service (docs/control.md), answered by the same handlers. " +
				"Authenticate with Authorization: Bearer <nats.token>, HTTP Basic with a nats.users entry, or a session cookie; changes need the admin role."},
		"paths": paths,
		"components": map[string]any{
			"schemas": map[string]any{"Error": map[string]any{"type": "object", "properties": map[string]any{
				"node": map[string]any{"type": "string"}, "cluster": map[string]any{"type": "string"},
				"error": map[string]any{"type": "object", "properties": map[string]any{
					"code": map[string]any{"type": "integer"}, "message": map[string]any{"type": "string"}}},
			}}},
			"securitySchemes": map[string]any{
				"bearer": map[string]any{"type": "http", "scheme": "bearer"},
				"basic":  map[string]any{"type": "http", "scheme": "basic"},
				"cookie": map[string]any{"type": "apiKey", "in": "cookie", "name": sessionCookie},
			},
		},
		"security": []any{map[string]any{"bearer": []any{}}, map[string]any{"basic": []any{}}, map[string]any{"cookie": []any{}}},
	}
}

func merge(a, b map[string]any) map[string]any {
	for k, v := range b {
		a[k] = v
	}
	return a
}

func (s *Server) openAPI(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, openAPIDoc(s.cfg.Version))
}
