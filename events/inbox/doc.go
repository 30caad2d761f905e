// Package inbox lets a consumer of the relay's messages process each
// message once: it records the message's message_id in an inbox collection
// in the same MongoDB transaction as the handler's own writes, commits, and
// only then acknowledges the delivery. A message whose id is already
// recorded (the relay's rare duplicate, or RabbitMQ's redelivery after a
// consumer died between commit and ack) is acknowledged without running
// the handler.
//
// A consumer creates an Inbox with New, calls Start (which finds out what
// the server can do), and passes the deliveries of one AMQP consumer to
// Run, or single deliveries to Handle:
//
//	in, err := inbox.New(client, handle, inbox.Config{Database: "shop"})
//	if err != nil { ... }
//	if err := in.Start(ctx); err != nil { ... }
//	defer in.Stop(ctx)
//	err = in.Run(ctx, deliveries) // from ch.Consume(queue, "", false, ...): manual acks
//
// # Guarantees
//
// With transactions (a replica set or a sharded cluster, found by the hello
// command's setName or msg "isdbgrid"), the handler's writes made with the
// context it is given and the inbox record commit or roll back together:
// exactly one commit per message id, whatever crashes when.
//
// Without transactions (a standalone server, FerretDB), Start logs a
// warning once and the inbox looks the id up, runs the handler, then
// inserts the record with _id = message id (a unique insert, atomic on
// FerretDB too). A crash after the handler and before the insert runs the
// handler again on redelivery, and two copies delivered at the same moment
// to two consumers can both run it: the handler must be idempotent.
//
// # Failures and attempts
//
// A handler error (or panic) rolls back and requeues the message; after
// MaxAttempts failed attempts it is rejected with requeue=false, which
// dead-letters it where the queue has a dead-letter exchange. The count
// lives in the x-delivery-count header where the queue sets one (a quorum
// queue, which Config.QueueType names: the consumer declares its queue, so
// it knows), otherwise in a document of the attempts collection, written
// outside the rolled-back transaction; on a classic queue the header is the
// publisher's and is ignored. A database failure requeues without
// counting an attempt. A message without message_id is rejected at once.
//
// # Tracing
//
// Each delivery is processed in a CONSUMER span, the child of the trace
// context of its traceparent header, which the handler's context carries
// (Config.TracerProvider, the global provider by default). When the span
// does not record, the handler's context carries the delivery's trace
// context itself, so the handler's own spans still continue the trace.
//
// # Storage
//
// Records expire after Retention through a TTL index, or, on servers
// without TTL indexes (FerretDB), through a cleanup job every
// CleanupInterval. See docs/inbox.md for the reference.
package inbox
