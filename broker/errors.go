package broker

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// closeError is why a channel or connection closed.
type closeError struct {
	what string // "channel" or "connection"
	err  *amqp.Error
}

func (e *closeError) Error() string {
	by := "the AMQP client"
	if e.err.Server {
		by = "the broker"
	}
	return fmt.Sprintf("%s closed by %s: %d %s", e.what, by, e.err.Code, e.err.Reason)
}

func (e *closeError) Unwrap() error { return e.err }

// closeCause says why a channel or connection closed; err is what the
// library's NotifyClose gave, nil for a close without an error.
func closeCause(what string, err *amqp.Error) error {
	if err == nil {
		return fmt.Errorf("%s closed", what)
	}
	return &closeError{what: what, err: err}
}

// poisonClose reports whether the broker closed the channel or connection
// with a code that one message's content can cause: a property it refuses
// (a CC header that is not an array: 406), a frame it cannot take (501),
// bad syntax (502), a method out of place (503, 505), or an unsupported
// feature (540). A connection forced closed (320), an internal error, a
// missing exchange or a network failure are outages instead: the same
// message may well go through on the next connection.
func poisonClose(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) || !ae.Server {
		return false
	}
	switch ae.Code {
	case amqp.PreconditionFailed, amqp.FrameError, amqp.SyntaxError, amqp.CommandInvalid,
		amqp.UnexpectedFrame, amqp.NotImplemented:
		return true
	}
	return false
}
