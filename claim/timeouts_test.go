package claim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/metrics"
)

// timeoutBatch is a batch of events as the relay holds it: claimed
// documents, their messages and fresh outcomes. Each event is "id" or
// "id/key", key being its aggregate id.
func timeoutBatch(t *testing.T, evs ...string) ([]events.Claimed, []*events.Message, []outcome) {
	t.Helper()
	claimed := make([]events.Claimed, len(evs))
	msgs := make([]*events.Message, len(evs))
	outcomes := make([]outcome, len(evs))
	for i, ev := range evs {
		id, key, _ := strings.Cut(ev, "/")
		d := events.Draft{ID: id, Type: "order.created", AggregateType: "order", AggregateID: key, Payload: bson.D{{Key: "n", Value: i}}}
		doc, err := d.Document(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		raw := testenv.Marshal(t, doc)
		claimed[i] = events.Claimed{ID: id, Attempts: 1, Doc: raw}
		m, err := events.NewMessage(raw, 0)
		if err != nil {
			t.Fatal(err)
		}
		msgs[i] = &m
		outcomes[i] = outcome{id: id, attempts: 1}
	}
	return claimed, msgs, outcomes
}

var errUnconfirmed = fmt.Errorf("%w: context deadline exceeded", events.ErrUnconfirmed)

// TestTimeouts drives the suspects through runs: each step is one run's
// batch, the suspect it should publish alone first, the publish results
// and what the outcomes must say afterwards.
func TestTimeouts(t *testing.T) {
	t.Parallel()
	type run struct {
		events    []string // "id" or "id/key", in publish order
		ordered   bool
		wantAlone string           // the event published alone first, "" for none
		results   map[string]error // publish results; confirmed when not named
		timedOut  bool
		want      map[string]string // the outcome of each event: ok, unconfirmed, timeout, nacked
	}
	tests := []struct {
		name string
		runs []run
	}{
		{
			name: "a timeout among many only makes suspects",
			runs: []run{
				{events: []string{"a", "b", "c"}, results: map[string]error{"b": errUnconfirmed}, timedOut: true,
					want: map[string]string{"a": "ok", "b": "unconfirmed", "c": "ok"}},
				// b is published alone first; confirmed, it is no longer a
				// suspect.
				{events: []string{"b", "d"}, wantAlone: "b", want: map[string]string{"b": "ok", "d": "ok"}},
				{events: []string{"b", "d"}, want: map[string]string{"b": "ok", "d": "ok"}},
			},
		},
		{
			name: "a suspect that keeps timing out alone fails",
			runs: []run{
				{events: []string{"a", "b"}, results: map[string]error{"a": errUnconfirmed, "b": errUnconfirmed}, timedOut: true,
					want: map[string]string{"a": "unconfirmed", "b": "unconfirmed"}},
				// a eats the run's time; b, not sent, stays a suspect.
				{events: []string{"a", "b"}, wantAlone: "a", results: map[string]error{"a": errUnconfirmed, "b": errUnconfirmed}, timedOut: true,
					want: map[string]string{"a": "unconfirmed", "b": "unconfirmed"}},
				{events: []string{"a", "b"}, wantAlone: "a", results: map[string]error{"a": errUnconfirmed, "b": errUnconfirmed}, timedOut: true,
					want: map[string]string{"a": "unconfirmed", "b": "unconfirmed"}},
				{events: []string{"a", "b"}, wantAlone: "a", results: map[string]error{"a": errUnconfirmed, "b": errUnconfirmed}, timedOut: true,
					want: map[string]string{"a": "timeout", "b": "unconfirmed"}},
				// a has failed; b, a suspect that never timed out alone, is
				// published alone first, and confirmed.
				{events: []string{"b", "c"}, wantAlone: "b", want: map[string]string{"b": "ok", "c": "ok"}},
			},
		},
		{
			name: "one message alone counts without being a suspect first",
			runs: []run{
				{events: []string{"a"}, results: map[string]error{"a": errUnconfirmed}, timedOut: true, want: map[string]string{"a": "unconfirmed"}},
				{events: []string{"a"}, wantAlone: "a", results: map[string]error{"a": errUnconfirmed}, timedOut: true, want: map[string]string{"a": "unconfirmed"}},
				{events: []string{"a"}, wantAlone: "a", results: map[string]error{"a": errUnconfirmed}, timedOut: true, want: map[string]string{"a": "timeout"}},
			},
		},
		{
			name: "a shutdown's missing confirms count nothing",
			runs: []run{
				{events: []string{"a"}, results: map[string]error{"a": errUnconfirmed}, want: map[string]string{"a": "unconfirmed"}},
				{events: []string{"a"}, results: map[string]error{"a": errUnconfirmed}, want: map[string]string{"a": "unconfirmed"}},
				{events: []string{"a"}, results: map[string]error{"a": errUnconfirmed}, want: map[string]string{"a": "unconfirmed"}},
				{events: []string{"a", "b"}, want: map[string]string{"a": "ok", "b": "ok"}},
			},
		},
		{
			name: "in order, a suspect behind an earlier event of its key waits its turn",
			runs: []run{
				{events: []string{"a/1", "b/2"}, ordered: true, results: map[string]error{"b": errUnconfirmed}, timedOut: true,
					want: map[string]string{"a": "ok", "b": "unconfirmed"}},
				{events: []string{"c/2", "b/2"}, ordered: true, want: map[string]string{"c": "ok", "b": "ok"}},
			},
		},
		{
			name: "in order, a suspect first of its key is published alone first",
			runs: []run{
				{events: []string{"a/1", "b/2"}, ordered: true, results: map[string]error{"b": errUnconfirmed}, timedOut: true,
					want: map[string]string{"a": "ok", "b": "unconfirmed"}},
				{events: []string{"c/1", "b/2", "d/2"}, ordered: true, wantAlone: "b",
					want: map[string]string{"c": "ok", "b": "ok", "d": "ok"}},
			},
		},
		{
			name: "a broker's answer clears a suspect",
			runs: []run{
				{events: []string{"a", "b"}, results: map[string]error{"a": errUnconfirmed}, timedOut: true,
					want: map[string]string{"a": "unconfirmed", "b": "ok"}},
				{events: []string{"a", "b"}, wantAlone: "a", results: map[string]error{"a": events.ErrNacked},
					want: map[string]string{"a": "nacked", "b": "ok"}},
				{events: []string{"a", "b"}, want: map[string]string{"a": "ok", "b": "ok"}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var to timeouts
			for n, r := range tt.runs {
				claimed, msgs, outcomes := timeoutBatch(t, r.events...)
				alone := to.isolate(claimed, msgs, outcomes, r.ordered)
				gotAlone := ""
				if alone >= 0 {
					gotAlone = msgs[alone].ID
				}
				if gotAlone != r.wantAlone {
					t.Fatalf("run %d published %q alone, want %q", n, gotAlone, r.wantAlone)
				}
				for i := range outcomes {
					outcomes[i].err = r.results[msgs[i].ID]
				}
				to.note(msgs, outcomes, alone, r.timedOut)
				got := map[string]string{}
				for i, o := range outcomes {
					got[msgs[i].ID] = kind(o.err)
				}
				if diff := cmp.Diff(r.want, got); diff != "" {
					t.Fatalf("run %d outcomes (-want +got):\n%s", n, diff)
				}
			}
		})
	}
}

func kind(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, errTimedOutAlone):
		return "timeout"
	case errors.Is(err, events.ErrUnconfirmed):
		return "unconfirmed"
	case errors.Is(err, errHeldBack):
		return "held"
	case errors.Is(err, events.ErrNacked):
		return "nacked"
	}
	return err.Error()
}

// TestPolicyTimeouts: an event that timed out alone too often fails with
// reason timeout; a timeout short of that is refunded.
func TestPolicyTimeouts(t *testing.T) {
	t.Parallel()
	p := policy{maxAttempts: 5, retryMin: time.Second, retryMax: time.Minute, jitter: func(d time.Duration) time.Duration { return d }}
	now := time.Date(2025, 3, 4, 12, 0, 0, 0, time.UTC)
	const timedOut = "publish timed out with the message published alone 3 times (OUTBOX_PUBLISH_TIMEOUT each): no confirm before the deadline: context deadline exceeded"
	for _, tt := range []struct {
		err  error
		want release
	}{
		{fmt.Errorf("%w 3 times (OUTBOX_PUBLISH_TIMEOUT each): %w", errTimedOutAlone, errUnconfirmed),
			release{events.Release{IDs: []any{"x"}, Status: events.StatusFailed, LastError: timedOut,
				Attempt: &events.AttemptError{At: now, Reason: metrics.ReasonTimeout, Error: timedOut}}, metrics.ReasonTimeout}},
		{errUnconfirmed, release{events.Release{IDs: []any{"x"}, Status: events.StatusNew, LastError: errUnconfirmed.Error(), Refund: true}, metrics.ReasonUnconfirmed}},
	} {
		_, got := p.plan([]outcome{{id: "x", attempts: 5, err: tt.err}}, now)
		if diff := cmp.Diff([]release{tt.want}, got, cmp.AllowUnexported(release{})); diff != "" {
			t.Errorf("plan(%v) (-want +got):\n%s", tt.err, diff)
		}
	}
}

// stallPublisher is the real publisher, except that one message never gets
// its confirm: it waits out the publish deadline, as a message the broker
// cannot take in time does, after the others of its call went out.
type stallPublisher struct {
	*faultPublisher
	stall string

	mu    sync.Mutex
	alone int // calls that carried the stalled message alone
}

func (p *stallPublisher) Publish(ctx context.Context, msgs []events.Message) []error {
	var rest []events.Message
	var index []int
	stalled := -1
	for i, m := range msgs {
		if m.ID == p.stall {
			stalled = i
			continue
		}
		rest = append(rest, m)
		index = append(index, i)
	}
	errs := make([]error, len(msgs))
	if len(rest) > 0 {
		for j, err := range p.faultPublisher.Publish(ctx, rest) {
			errs[index[j]] = err
		}
	}
	if stalled >= 0 {
		if len(msgs) == 1 {
			p.mu.Lock()
			p.alone++
			p.mu.Unlock()
		}
		<-ctx.Done()
		errs[stalled] = fmt.Errorf("%w: %v", events.ErrUnconfirmed, ctx.Err())
	}
	return errs
}

// TestRunOnceFailsAMessageThatTimesOutAlone: on FerretDB and RabbitMQ, a
// message that never gets its confirm within the publish timeout is
// published alone, first, in the runs that follow (its batch-mates, left
// without time, go back to NEW without using an attempt and are delivered
// later), and after TimeoutsAloneMax timeouts alone it is FAILED with
// reason timeout, instead of being refunded for ever.
func TestRunOnceFailsAMessageThatTimesOutAlone(t *testing.T) {
	t.Parallel()
	r := setup(t)
	pub := &stallPublisher{faultPublisher: &faultPublisher{Publisher: newPublisher(t, r.exchange)}}
	c, m := newClaimer(t, r.store, pub, Config{PublishTimeout: 300 * time.Millisecond})
	first := insertEvents(t, r.coll, 10, "order.created")
	pub.stall = first[4]

	runOnce(t, c) // the stalled message times out among nine others
	later := insertEvents(t, r.coll, 10, "order.created")
	for run := 0; run < 10 && allEvents(t, r.coll)[pub.stall].Status != events.StatusFailed; run++ {
		runOnce(t, c)
	}

	e := allEvents(t, r.coll)[pub.stall]
	if e.Status != events.StatusFailed || !strings.Contains(e.LastError, "published alone 3 times") || e.Attempts > 1 {
		t.Errorf("stalled event: %s after %d attempts, lastError %q; want FAILED, published alone 3 times, its attempts refunded",
			e.Status, e.Attempts, e.LastError)
	}
	if pub.alone != TimeoutsAloneMax {
		t.Errorf("the stalled message was published alone %d times, want %d", pub.alone, TimeoutsAloneMax)
	}
	if got := testutil.ToFloat64(m.Failed.WithLabelValues(metrics.ReasonTimeout)); got != 1 {
		t.Errorf("failed{reason=timeout} = %v, want 1", got)
	}
	// Every other event is delivered, once, and PUBLISHED; but for the
	// later event of the stalled one's aggregate (insertEvents numbers
	// aggregates from 0 again), which the FAILED event holds back.
	var others []string
	for _, id := range append(first, later...) {
		if id != pub.stall && id != later[4] {
			others = append(others, id)
		}
	}
	for run := 0; run < 5; run++ {
		runOnce(t, c)
	}
	if diff := cmp.Diff(once(others), testenv.Receive(t, r.deliveries, others, waitFor)); diff != "" {
		t.Errorf("the other messages, by id (-want +got):\n%s", diff)
	}
	for _, id := range others {
		if e := allEvents(t, r.coll)[id]; e.Status != events.StatusPublished || e.Attempts != 1 {
			t.Errorf("event %s: %s after %d attempts, want PUBLISHED after 1 (a timeout uses no attempt)", id, e.Status, e.Attempts)
		}
	}
	if e := allEvents(t, r.coll)[later[4]]; e.Status != events.StatusNew {
		t.Errorf("the event behind the FAILED one in its aggregate: %s, want NEW (held)", e.Status)
	}
}
