package inbox

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Run processes deliveries one at a time until deliveries is closed (it
// returns nil) or ctx ends (it returns ctx.Err()), or an acknowledgement
// fails because the channel is gone (it returns that error; reconnect and
// call Run again: whatever was committed and not acknowledged is
// redelivered and skipped).
//
// Acknowledgements are batched: Run acknowledges with one multiple-ack
// after AckBatch settled messages, and whenever no further delivery is
// waiting, always before it blocks. Every message it acknowledges has
// committed, so a batch lost with the channel only costs redeliveries that
// the inbox skips. Because a multiple-ack covers every earlier delivery of
// the channel, deliveries must come from one consumer on one AMQP channel
// that nothing else acknowledges on. For parallelism, run one Inbox.Run per
// channel (and consumer) with its own prefetch.
//
// After a database failure Run waits RetryPause before the next message.
func (i *Inbox) Run(ctx context.Context, deliveries <-chan amqp.Delivery) error {
	i.mu.Lock()
	started := i.started
	i.mu.Unlock()
	if !started {
		return ErrNotStarted
	}
	b := ackBatch{max: i.cfg.AckBatch}
	for {
		if ctx.Err() != nil {
			return b.finish(ctx.Err())
		}
		var (
			d  amqp.Delivery
			ok bool
		)
		select {
		case d, ok = <-deliveries:
		default:
			// Nothing waiting: acknowledge before blocking, so the broker's
			// prefetch window never fills with settled messages.
			if err := b.flush(); err != nil {
				return err
			}
			select {
			case d, ok = <-deliveries:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if !ok {
			return b.finish(nil)
		}
		out, err := i.process(ctx, d)
		if out == outcomeAck {
			if ferr := b.add(d); ferr != nil {
				return ferr
			}
		} else if serr := settle(d, out); serr != nil {
			// The channel is gone: what was committed is redelivered and
			// skipped, the rest retried.
			return fmt.Errorf("inbox: settle message %s: %w", d.MessageId, serr)
		}
		if err != nil && ctx.Err() == nil {
			if ferr := b.flush(); ferr != nil {
				return ferr
			}
			if !i.pause(ctx) {
				return ctx.Err()
			}
		}
	}
}

// pause waits RetryPause; false means ctx ended first.
func (i *Inbox) pause(ctx context.Context) bool {
	if i.cfg.RetryPause <= 0 {
		return true
	}
	t := time.NewTimer(i.cfg.RetryPause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ackBatch holds the latest delivery to acknowledge and how many settled
// messages one multiple-ack of it will cover.
type ackBatch struct {
	max  int
	last amqp.Delivery
	n    int
}

func (b *ackBatch) add(d amqp.Delivery) error {
	b.last = d
	b.n++
	if b.n >= b.max {
		return b.flush()
	}
	return nil
}

func (b *ackBatch) flush() error {
	if b.n == 0 {
		return nil
	}
	b.n = 0
	if err := b.last.Ack(true); err != nil {
		return fmt.Errorf("inbox: acknowledge up to message %s: %w", b.last.MessageId, err)
	}
	return nil
}

// finish acknowledges what is settled and returns cause, or the ack's
// error when there is no cause.
func (b *ackBatch) finish(cause error) error {
	if err := b.flush(); err != nil && cause == nil {
		return err
	}
	return cause
}
