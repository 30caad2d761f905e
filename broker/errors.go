package broker

import "errors"

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
)
