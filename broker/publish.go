package broker

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/events"
)

// Publish publishes msgs to the exchange, persistent and mandatory, and
// waits for their confirms. It returns one error per message: nil for a
// message the broker confirmed and routed; otherwise one wrapping
// ErrUnavailable, ErrNacked, ErrReturned or ErrUnconfirmed.
func (p *Publisher) Publish(ctx context.Context, msgs []events.Message) []error {
	errs := make([]error, len(msgs))
	p.publishing.Lock()
	defer p.publishing.Unlock()
	for start := 0; start < len(msgs); start += p.cfg.Window {
		end := min(start+p.cfg.Window, len(msgs))
		p.publishWindow(ctx, msgs[start:end], errs[start:end])
	}
	return errs
}

func (p *Publisher) publishWindow(ctx context.Context, msgs []events.Message, errs []error) {
	s, err := p.readySession()
	if err != nil {
		fill(errs, err)
		return
	}
	discardReturns(s.returns) // stale returns from a window that timed out
	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	// The window's frames leave in a few large writes rather than one per
	// message; the confirms are awaited after the flush either way.
	s.wire.cork()
	for i, m := range msgs {
		dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, m.Type, true, false, publishing(m))
		if err != nil {
			fill(errs[i:], fmt.Errorf("%w: publish: %v", ErrUnavailable, err))
			break
		}
		confirms[i] = dc
	}
	if err := s.wire.flush(); err != nil {
		// The socket failed under frames the library counts as sent.
		// Closing the connection makes it fail their confirms at once
		// (ErrUnavailable below) rather than at the publish timeout.
		p.logger.Warn("broker write failed; closing the connection", "error", err)
		_ = s.conn.Close()
	}
	for i, dc := range confirms {
		if dc == nil {
			continue
		}
		acked, err := dc.WaitContext(ctx)
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("%w: %v", ErrUnconfirmed, err)
		case !acked && s.ch.IsClosed():
			// The library nacks every pending confirm when the channel dies.
			errs[i] = fmt.Errorf("%w: channel closed before the confirm", ErrUnavailable)
		case !acked:
			errs[i] = ErrNacked
		}
	}
	p.matchReturns(s.returns, msgs, errs)
}

func (p *Publisher) readySession() (*session, error) {
	if err := p.Ready(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sess, nil
}

// matchReturns marks the messages the broker returned as unroutable. The
// broker sends basic.return before the basic.ack of the same message, and
// the library queues the return before it resolves the confirm, so every
// return of this window is buffered by now.
func (p *Publisher) matchReturns(returns <-chan amqp.Return, msgs []events.Message, errs []error) {
	var index map[string]int
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				return
			}
			if index == nil {
				index = make(map[string]int, len(msgs))
				for i, m := range msgs {
					index[m.ID] = i
				}
			}
			if i, found := index[r.MessageId]; found && errs[i] == nil {
				errs[i] = fmt.Errorf("%w: %d %s (routing key %q)", ErrReturned, r.ReplyCode, r.ReplyText, r.RoutingKey)
			}
		default:
			return
		}
	}
}

func discardReturns(returns <-chan amqp.Return) {
	for {
		select {
		case _, ok := <-returns:
			if !ok {
				return
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
		ContentType:  events.ContentType,
		MessageId:    m.ID,
		Type:         m.Type,
		Timestamp:    m.Timestamp,
		Headers:      table(m.Headers),
		Body:         m.Body,
	}
}

// table converts nested header maps to the amqp.Table the encoder expects.
func table(h map[string]any) amqp.Table {
	if h == nil {
		return nil
	}
	t := make(amqp.Table, len(h))
	for k, v := range h {
		t[k] = field(v)
	}
	return t
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
