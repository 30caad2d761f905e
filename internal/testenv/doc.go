// Package testenv gives integration tests the servers they talk to: a
// MongoDB wire-protocol server, RabbitMQ, a TCP proxy for fault injection
// and stand-in servers (Serve); and what tests of several packages share:
// unique names, marshalled documents, waits, Configs New must refuse,
// services started and stopped at cleanup, log buffers. It is imported
// only from _test.go files, and imports none of the packages it serves (a
// prepared store of package mongo is mongo/mongotest's).
//
// MongoDB: OUTBOX_TEST_MONGO_URI selects a real server. Without it, the test
// binary starts one embedded FerretDB v1.24.0 backed by PostgreSQL
// (OUTBOX_TEST_POSTGRES_URL, default postgres://postgres@127.0.0.1:5432/postgres)
// in a PostgreSQL database of its own, so that packages tested in parallel
// never share FerretDB metadata.
//
// RabbitMQ: OUTBOX_TEST_AMQP_URL, default amqp://guest:guest@127.0.0.1:5672/.
//
// A missing server fails the test with instructions to start it; tests are
// never skipped for that, except by RequireDocker, which guards the
// container suite that runs where Docker exists: ReplicaSet (a real MongoDB
// replica set), Containers (that and RabbitMQ), RabbitMQ and RabbitMQOf (one
// RabbitMQ of RabbitImages, 3.x or 4.x) start its servers, and Dex an
// OpenID provider (or from a dex binary, OUTBOX_TEST_DEX_BINARY, without
// Docker).
//
// GoTest runs a suite again in another process with servers named in its
// environment: the broker's on each RabbitMQ of RabbitImages, and the
// public module's (events/), which `go test ./...` does not enter.
package testenv
