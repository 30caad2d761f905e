// Package broker publishes outbox messages to RabbitMQ with publisher
// confirms, and keeps its connection alive: it reconnects with backoff when
// the connection or channel drops, and reports itself unavailable while it
// is down or the broker has blocked it (a memory or disk alarm).
//
// Publishes are pipelined: a window of messages is sent, then the confirms
// are awaited together. Every message is published mandatory, so one the
// broker cannot route comes back as ErrReturned rather than a silent ack.
package broker
