package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/events"
)

// isolatedTries is how many times a suspect published alone may close the
// channel or connection before it counts as rejected. More than one, so
// that a close that merely coincided with it does not fail an event.
const isolatedTries = 2

// Publish publishes msgs to the exchange, persistent and mandatory, and
// waits for their confirms. It returns one error per message: nil for a
// message the broker confirmed and routed; otherwise one wrapping
// events.ErrUnavailable, ErrNacked, ErrReturned, ErrUnconfirmed or
// ErrRejected, or an *events.InvalidError for a message whose properties do
// not fit the broker's frame size.
//
// When the broker closes the channel or connection while a window is in
// flight with a code that one message can cause, the window's unconfirmed
// messages are published again one at a time on the next connection (Publish
// waits for it, within ctx), so that one bad message fails alone as
// events.ErrRejected instead of taking its whole batch back to NEW forever.
func (p *Publisher) Publish(ctx context.Context, msgs []events.Message) []error {
	errs := make([]error, len(msgs))
	p.publishing.Lock()
	defer p.publishing.Unlock()
	for start := 0; start < len(msgs); {
		end := p.windowEnd(msgs, start)
		p.publishWindow(ctx, msgs[start:end], errs[start:end])
		start = end
	}
	return errs
}

// windowEnd returns where the window starting at start ends: after at most
// Window messages, and before a message id the window already holds. A
// basic.return names the message only by its id, so within a window an id
// must name one publish.
func (p *Publisher) windowEnd(msgs []events.Message, start int) int {
	seen := make(map[string]struct{}, min(p.cfg.Window, len(msgs)-start))
	end := start
	for end < len(msgs) && end-start < p.cfg.Window {
		if _, dup := seen[msgs[end].ID]; dup {
			break
		}
		seen[msgs[end].ID] = struct{}{}
		end++
	}
	return end
}

func (p *Publisher) publishWindow(ctx context.Context, msgs []events.Message, errs []error) {
	s, err := p.readySession()
	if err != nil {
		fill(errs, err)
		return
	}
	all := make([]int, len(msgs))
	for i := range all {
		all[i] = i
	}
	r := p.attempt(ctx, s, msgs, all, errs)
	if len(r.suspects) == 0 || !r.poisoned {
		return
	}
	p.logger.Warn("broker closed the channel or connection during a window, for a reason one message can cause; "+
		"publishing its unconfirmed messages one at a time to find it",
		append(closeAttrs(r.cause), "unconfirmed", len(r.suspects))...)
	p.isolate(ctx, msgs, r.suspects, errs)
}

// isolate publishes each suspect alone, on a live session, until it gets an
// ordinary result or has closed the session isolatedTries times.
func (p *Publisher) isolate(ctx context.Context, msgs []events.Message, suspects []int, errs []error) {
	for n, i := range suspects {
		for tries := 0; tries < isolatedTries; {
			s, err := p.waitSession(ctx)
			if err != nil {
				for _, j := range suspects[n:] {
					errs[j] = err
				}
				return
			}
			r := p.attempt(ctx, s, msgs, []int{i}, errs)
			switch {
			case len(r.suspects) == 0:
				tries = isolatedTries // an ordinary result: confirmed, nacked, returned, unconfirmed
			case !r.sent:
				// It never left: the session was already closing. Not a try.
			case !r.poisoned:
				// An outage meanwhile; what is left goes back unblamed.
				for _, j := range suspects[n:] {
					errs[j] = fmt.Errorf("%w: %v", events.ErrUnavailable, r.cause)
				}
				return
			default:
				tries++
				if tries == isolatedTries {
					errs[i] = fmt.Errorf("%w: %w (published alone %d times)", events.ErrRejected, r.cause, tries)
					p.logger.Warn("broker rejected a message: published alone, it closed the channel or connection every time",
						append(closeAttrs(r.cause), "event_id", msgs[i].ID, "event_type", msgs[i].Type)...)
				}
			}
		}
	}
}

// attemptResult is what one pass over some messages of a window left
// undecided.
type attemptResult struct {
	// suspects are the messages that the channel or connection closing
	// left without a result, in publish order: sent but unconfirmed,
	// refused by the client, or not sent because of the close. Their
	// errors say events.ErrUnavailable until isolate decides otherwise.
	suspects []int
	sent     bool  // whether any suspect left for the broker or was refused
	cause    error // why the session closed
	poisoned bool  // the close is one a message can cause
}

// attempt publishes msgs[idx...] on s as one pipelined window and waits
// for their confirms, writing each message's result to errs.
func (p *Publisher) attempt(ctx context.Context, s *session, msgs []events.Message, idx []int, errs []error) attemptResult {
	var (
		r        attemptResult
		refusal  error
		dcs      = make([]*amqp.DeferredConfirmation, 0, len(idx))
		sentIdx  = make([]int, 0, len(idx))
		outcomes = make(map[int]bool) // suspects: true when sent or refused
	)
	if err := ctx.Err(); err != nil {
		// Not even a session's socket is touched for a context already over.
		for _, i := range idx {
			errs[i] = fmt.Errorf("%w: not sent: %v", events.ErrUnconfirmed, err)
		}
		return r
	}
	// The window's frames leave in a few large writes rather than one per
	// message; the confirms are awaited after the flush either way.
	s.wire.cork()
	// A write blocked past the deadline would hold the library's locks:
	// close the socket under it instead.
	stopAbort := context.AfterFunc(ctx, s.wire.abort)
send:
	for k, i := range idx {
		m := msgs[i]
		pub := publishing(m)
		if err := checkContentHeader(pub, s.frameMax); err != nil {
			errs[i] = err
			continue
		}
		dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, m.Type, true, false, pub)
		switch {
		case err == nil:
			dcs = append(dcs, dc)
			sentIdx = append(sentIdx, i)
		case ctx.Err() != nil && errors.Is(err, ctx.Err()):
			for _, j := range idx[k:] {
				errs[j] = fmt.Errorf("%w: not sent: %v", events.ErrUnconfirmed, err)
			}
			break send
		case errors.Is(err, amqp.ErrClosed):
			for _, j := range idx[k:] {
				outcomes[j] = false
			}
			break send
		case isNetError(err):
			s.end(fmt.Errorf("write to the broker: %w", err))
			for _, j := range idx[k:] {
				outcomes[j] = false
			}
			break send
		default:
			// The client would not encode it. It had begun to send the
			// message, so it is closing the connection in the background:
			// end the session now, so that nothing more is sent on it and
			// no waitSession takes it for live.
			refusal = fmt.Errorf("the AMQP client refused it: %w", err)
			s.end(refusal)
			outcomes[i] = true
			for _, j := range idx[k+1:] {
				outcomes[j] = false
			}
			break send
		}
	}
	stopAbort()
	if err := s.wire.flush(); err != nil {
		// The socket failed under frames the library counts as sent.
		// Ending the session closes the connection, which fails their
		// confirms at once (events.ErrUnavailable) rather than at the deadline.
		s.end(fmt.Errorf("write to the broker: %w", err))
		s.wire.abort()
	}

	outstanding := 0
	for k, dc := range dcs {
		i := sentIdx[k]
		acked, ok := waitConfirm(ctx, dc)
		switch {
		case !ok:
			errs[i] = fmt.Errorf("%w: %v", events.ErrUnconfirmed, ctx.Err())
			outstanding++
		case acked:
			errs[i] = nil
		case s.ch.IsClosed() || s.ended():
			// The library nacks every pending confirm when the channel dies.
			outcomes[i] = true
		default:
			errs[i] = events.ErrNacked
		}
	}
	p.matchReturns(s.returns, msgs, sentIdx, errs)
	if outstanding > 0 && !s.ended() {
		p.logger.Warn("broker confirms outstanding at the publish deadline; replacing the connection "+
			"so that their late returns cannot be taken for a later publish's", "outstanding", outstanding)
		s.end(errRetired)
	}
	if len(outcomes) == 0 {
		return r
	}

	if refusal != nil {
		r.cause, r.poisoned = refusal, true
	} else {
		select {
		case <-s.closed:
			r.cause = s.cause
		case <-ctx.Done():
			r.cause = fmt.Errorf("channel closed: %v before its cause was known", ctx.Err())
		}
		r.poisoned = poisonClose(r.cause)
	}
	for i, sent := range outcomes {
		r.suspects = append(r.suspects, i)
		r.sent = r.sent || sent
		errs[i] = fmt.Errorf("%w: %v", events.ErrUnavailable, r.cause)
	}
	slices.Sort(r.suspects)
	return r
}

// waitConfirm waits for dc within ctx. ok is false when ctx ended first; a
// confirm that has arrived wins over a context that has ended, so that a
// message confirmed in time is never reported unconfirmed (and published
// again) because select chose at random between the two.
func waitConfirm(ctx context.Context, dc confirmation) (acked, ok bool) {
	select {
	case <-dc.Done():
		return dc.Acked(), true
	default:
	}
	select {
	case <-dc.Done():
		return dc.Acked(), true
	case <-ctx.Done():
		select {
		case <-dc.Done():
			return dc.Acked(), true
		default:
			return false, false
		}
	}
}

// confirmation is the part of *amqp.DeferredConfirmation waitConfirm uses.
type confirmation interface {
	Done() <-chan struct{}
	Acked() bool
}

// isNetError reports whether err is the socket failing (a write timeout
// included) rather than the client refusing a message.
func isNetError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrClosedPipe) || errors.Is(err, io.ErrShortWrite)
}

// waitSession returns a live, unblocked session, waiting within ctx for
// the run loop to reconnect if need be.
func (p *Publisher) waitSession(ctx context.Context) (*session, error) {
	for {
		p.mu.Lock()
		s, blocked, changed := p.sess, p.blocked, p.changed
		p.mu.Unlock()
		if s != nil && !blocked && !s.ended() {
			return s, nil
		}
		var ended <-chan struct{}
		if s != nil && !s.ended() {
			ended = s.closed
		}
		select {
		case <-changed:
		case <-ended:
		case <-p.done:
			return nil, fmt.Errorf("%w: publisher stopped", events.ErrUnavailable)
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: not reconnected before the deadline: %v", events.ErrUnavailable, ctx.Err())
		}
	}
}

// matchReturns marks the messages the broker returned as unroutable. The
// broker sends basic.return before the basic.ack of the same message, and
// the library queues the return before it resolves the confirm, so every
// return of this window is buffered by now; and none of another window is
// (see the returns buffer in open).
func (p *Publisher) matchReturns(returns <-chan amqp.Return, msgs []events.Message, sent []int, errs []error) {
	var index map[string]int
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				return
			}
			if index == nil {
				index = make(map[string]int, len(sent))
				for _, i := range sent {
					index[msgs[i].ID] = i
				}
			}
			if i, found := index[r.MessageId]; found && errs[i] == nil {
				errs[i] = fmt.Errorf("%w: %d %s (routing key %q)", events.ErrReturned, r.ReplyCode, r.ReplyText, r.RoutingKey)
			}
		default:
			return
		}
	}
}

func fill(errs []error, err error) {
	for i := range errs {
		errs[i] = err
	}
}

// publishing builds the AMQP message of the contract in
// docs/message-contract.md.
func publishing(m events.Message) amqp.Publishing {
	return amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		ContentType:  cmp.Or(m.ContentType, events.ContentType),
		MessageId:    m.ID,
		Type:         m.Type,
		Timestamp:    m.Timestamp,
		Headers:      table(m.Headers),
		Body:         m.Body,
	}
}

// table converts nested header maps to the amqp.Table the encoder expects.
// Headers without nested maps or arrays, such as the aggregate headers
// alone, are the same map under the encoder's type: no copy per message.
func table(h map[string]any) amqp.Table {
	if h == nil {
		return nil
	}
	if flat(h) {
		return amqp.Table(h)
	}
	t := make(amqp.Table, len(h))
	for k, v := range h {
		t[k] = field(v)
	}
	return t
}

// flat reports whether no header value is a map or an array, the only
// values field converts.
func flat(h map[string]any) bool {
	for _, v := range h {
		switch v.(type) {
		case map[string]any, []any:
			return false
		}
	}
	return true
}

func field(v any) any {
	switch v := v.(type) {
	case map[string]any:
		return table(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = field(e)
		}
		return out
	default:
		return v
	}
}
