package events

import "errors"

// The kinds of failure a publisher reports for one message. They live here,
// beside the message, so that the publisher (package broker) can return them
// and the claimer can tell them apart without either importing the other:
// each decides differently what becomes of the event.
var (
	// ErrUnavailable means the broker could not take the message: not
	// connected, connection or channel lost, or blocked by an alarm. It is
	// not the message's fault and says nothing about the message itself.
	ErrUnavailable = errors.New("broker unavailable")
	// ErrNacked means the broker refused the message (basic.nack).
	ErrNacked = errors.New("broker nacked the message")
	// ErrReturned means the broker could not route the message to any
	// queue: no queue is bound for its routing key.
	ErrReturned = errors.New("broker returned the message as unroutable")
	// ErrUnconfirmed means no confirm came before the context ended. The
	// broker may or may not have the message.
	ErrUnconfirmed = errors.New("no confirm before the deadline")
	// ErrRejected means the message itself breaks the protocol: published
	// alone, it made the broker close the channel or connection (or the
	// client refused to encode it) on every try. Retrying cannot help. The
	// publisher wraps the cause, so the close's code and text are in the
	// error's message.
	ErrRejected = errors.New("broker rejected the message")
)
