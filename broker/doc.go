// Package broker publishes outbox messages to RabbitMQ with publisher
// confirms, and keeps its connection alive: it reconnects with backoff when
// the connection or channel drops, and reports itself unavailable while it
// is down or the broker has blocked it (a memory or disk alarm).
//
// Publishes are pipelined: a window of messages is sent, then the confirms
// are awaited together. Every message is published mandatory, so one the
// broker cannot route comes back as events.ErrReturned rather than a silent
// ack.
// Returns never outlive their window: a window that ends with confirms
// outstanding retires its connection, so a late return is never matched to
// a later publish of the same message.
//
// One message cannot stop the rest. A message whose content header would
// not fit the negotiated frame size is an *events.InvalidError and is not
// sent. When the broker closes the channel or connection during a window
// with a code one message can cause (406, 501, 502, 503, 505, 540), or the
// client refuses to encode a message, the unconfirmed messages are
// published again one at a time on the next connection; one that closes it
// alone twice is events.ErrRejected. An outage leaves them
// events.ErrUnavailable.
//
// Every socket write has a deadline (Config.WriteTimeout), and Stop closes
// the socket under a write that is still blocked, so a broker that stops
// reading cannot hang the publisher.
package broker
