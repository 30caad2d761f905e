package claim

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/mongo/mongotest"
)

func TestRunOnceRelaysBacklog(t *testing.T) {
	t.Parallel()
	const n, batch = 1200, 500
	r := setup(t)
	c, m := newClaimer(t, r.store, newPublisher(t, r.exchange), Config{BatchSize: batch})
	ids := insertEvents(t, r.coll, n, "order.created")

	var mores []bool
	mores = append(mores, runOnce(t, c))
	// The first batch is the oldest 500.
	var first []string
	for id, e := range allEvents(t, r.coll) {
		if e.Status == events.StatusPublished {
			first = append(first, id)
		}
	}
	if diff := cmp.Diff(once(ids[:batch]), once(first)); diff != "" {
		t.Errorf("first batch is not the oldest %d events (-want +got):\n%s", batch, diff)
	}
	for mores[len(mores)-1] && len(mores) < 10 {
		mores = append(mores, runOnce(t, c))
	}
	// 500, 500, 200: the full batches ask for more at once, the short one
	// does not.
	if diff := cmp.Diff([]bool{true, true, false}, mores); diff != "" {
		t.Errorf("runOnce more (-want +got):\n%s", diff)
	}
	if more := runOnce(t, c); more {
		t.Error("runOnce on an empty outbox: more = true")
	}

	if diff := cmp.Diff(once(ids), testenv.Receive(t, r.deliveries, ids, waitFor)); diff != "" {
		t.Errorf("messages received, by id (-want +got):\n%s", diff)
	}
	for id, e := range allEvents(t, r.coll) {
		if e.Status != events.StatusPublished || e.PublishedAt.IsZero() || e.Attempts != 1 {
			t.Errorf("event %s: status %s publishedAt %s attempts %d; want PUBLISHED with publishedAt, 1 attempt",
				id, e.Status, e.PublishedAt, e.Attempts)
		}
	}
	for name, got := range map[string]float64{
		"claimed": testutil.ToFloat64(m.Claimed), "published": testutil.ToFloat64(m.Published),
	} {
		if got != n {
			t.Errorf("%s metric = %v, want %d", name, got, n)
		}
	}
	if got := testutil.ToFloat64(m.LostClaims); got != 0 {
		t.Errorf("lost claims = %v, want 0", got)
	}
}

// Poison events of every kind, spread through a full batch of 500, fail in
// the one pass that claims them, naming their field, while every valid event
// of the batch is delivered.
func TestRunOncePoisonFailsInOnePass(t *testing.T) {
	t.Parallel()
	const batch = 500
	r := setup(t)
	c, m := newClaimer(t, r.store, newPublisher(t, r.exchange), Config{BatchSize: batch, MaxBodyBytes: 1000})

	ok := bson.D{{Key: "n", Value: 1}}
	poison := []struct {
		id        string
		fields    bson.D // besides _id, status and createdAt
		wantField string
	}{
		{"no-type", bson.D{{Key: "payload", Value: ok}}, `"type"`},
		{"empty-type", bson.D{{Key: "type", Value: ""}, {Key: "payload", Value: ok}}, `"type"`},
		{"number-type", bson.D{{Key: "type", Value: 7}, {Key: "payload", Value: ok}}, `"type"`},
		{"no-payload", bson.D{{Key: "type", Value: "order.created"}}, `"payload"`},
		{"payload-string", bson.D{{Key: "type", Value: "order.created"}, {Key: "payload", Value: `{"n":1}`}}, `"payload"`},
		{"too-big", bson.D{{Key: "type", Value: "order.created"},
			{Key: "payload", Value: bson.D{{Key: "blob", Value: strings.Repeat("x", 2000)}}}}, `"payload"`},
		{"header-regex", bson.D{{Key: "type", Value: "order.created"}, {Key: "payload", Value: ok},
			{Key: "headers", Value: bson.D{{Key: "match", Value: bson.Regex{Pattern: "^a", Options: "i"}}}}}, `"headers.match"`},
		{"headers-string", bson.D{{Key: "type", Value: "order.created"}, {Key: "payload", Value: ok},
			{Key: "headers", Value: "tenant=acme"}}, `"headers"`},
		{"aggregate-id-number", bson.D{{Key: "type", Value: "order.created"}, {Key: "payload", Value: ok},
			{Key: "aggregateId", Value: 42}}, `"aggregateId"`},
	}
	valid := insertEvents(t, r.coll, batch-len(poison), "order.created")
	// insertEvents spaces the valid events 1 ms apart from an hour ago:
	// poison event k sorts among them, every 50 or so.
	first := time.Now().Add(-time.Hour)
	for k, p := range poison {
		doc := append(bson.D{{Key: "_id", Value: p.id}}, p.fields...)
		doc = append(doc, bson.E{Key: "status", Value: "NEW"},
			bson.E{Key: "createdAt", Value: first.Add(time.Duration(k*50+25) * time.Millisecond)})
		if _, err := r.coll.InsertOne(t.Context(), doc); err != nil {
			t.Fatalf("insert %s: %v", p.id, err)
		}
	}

	runOnce(t, c) // one pass: the whole outbox is one batch

	if diff := cmp.Diff(once(valid), testenv.Receive(t, r.deliveries, valid, waitFor)); diff != "" {
		t.Errorf("messages received, by id (-want +got):\n%s", diff)
	}
	all := allEvents(t, r.coll)
	for _, id := range valid {
		if e := all[id]; e.Status != events.StatusPublished || e.Attempts != 1 {
			t.Errorf("valid event %s: %s after %d attempts, want PUBLISHED after 1", id, e.Status, e.Attempts)
		}
	}
	for _, p := range poison {
		e := all[p.id]
		if e.Status != events.StatusFailed || e.Attempts != 1 || e.FailedAt.IsZero() {
			t.Errorf("poison %s: status %s attempts %d failedAt %s; want FAILED at once, after 1 attempt", p.id, e.Status, e.Attempts, e.FailedAt)
		}
		if !strings.Contains(e.LastError, p.wantField) {
			t.Errorf("poison %s: lastError %q does not name the field %s", p.id, e.LastError, p.wantField)
		}
	}
	if got := testutil.ToFloat64(m.Failed.WithLabelValues(metrics.ReasonInvalid)); got != float64(len(poison)) {
		t.Errorf("failed{reason=invalid} = %v, want %d", got, len(poison))
	}
	if got := testutil.ToFloat64(m.Published); got != float64(len(valid)) {
		t.Errorf("published = %v, want %d", got, len(valid))
	}
}

func TestRunOnceUnroutableRetriesLater(t *testing.T) {
	t.Parallel()
	store := mongotest.Store(t)
	coll := store.Collection()
	exchange := testenv.UniqueName(t, "ex_") // no queue bound: every publish returns
	pub := newPublisher(t, exchange)
	c, m := newClaimer(t, store, pub, Config{BatchSize: 500, MaxAttempts: 3, RetryMin: time.Minute, RetryMax: time.Hour})
	ids := insertEvents(t, coll, 5, "order.created")

	before := time.Now()
	if more := runOnce(t, c); more {
		t.Error("more = true for a short batch")
	}
	for _, id := range ids {
		e := allEvents(t, coll)[id]
		// RetryMin 1m jittered down by up to half: at least 30s from now.
		if e.Status != events.StatusNew || e.Attempts != 1 || !e.RetryAt.After(before.Add(29*time.Second)) {
			t.Errorf("event %s: status %s attempts %d retryAt %s; want NEW, 1 attempt kept, retry at least 30s after %s",
				id, e.Status, e.Attempts, e.RetryAt, before)
		}
		if !strings.Contains(e.LastError, "unroutable") {
			t.Errorf("event %s: lastError %q, want it to say the message was unroutable", id, e.LastError)
		}
		for _, f := range []string{events.FieldWorkerID, events.FieldClaimToken, events.FieldProcessingAt} {
			if testenv.HasField(t, coll, oid(t, id), f) {
				t.Errorf("event %s: %s still set after release to NEW", id, f)
			}
		}
	}
	if got := testutil.ToFloat64(m.Released.WithLabelValues(metrics.ReasonReturned)); got != 5 {
		t.Errorf("released{reason=returned} = %v, want 5", got)
	}

	// Waiting for the retry: the next run claims nothing.
	if more := runOnce(t, c); more {
		t.Error("more = true with nothing due")
	}
	if got := testutil.ToFloat64(m.Claimed); got != 5 {
		t.Errorf("claimed = %v after a run with every event waiting for its retry, want 5", got)
	}

	// Once due, with a queue bound, the retry delivers them.
	deliveries := testenv.Consume(t, testenv.AMQPURL(t), exchange)
	c.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	runOnce(t, c)
	if diff := cmp.Diff(once(ids), testenv.Receive(t, deliveries, ids, waitFor)); diff != "" {
		t.Errorf("messages received on retry, by id (-want +got):\n%s", diff)
	}
	for id, e := range allEvents(t, coll) {
		if e.Status != events.StatusPublished || e.Attempts != 2 {
			t.Errorf("event %s after its retry: %s after %d attempts, want PUBLISHED after 2", id, e.Status, e.Attempts)
		}
	}
}

func TestRunOnceUnroutableLastAttemptFails(t *testing.T) {
	t.Parallel()
	store := mongotest.Store(t)
	coll := store.Collection()
	c, m := newClaimer(t, store, newPublisher(t, testenv.UniqueName(t, "ex_")), Config{MaxAttempts: 1})
	ids := insertEvents(t, coll, 3, "order.created")

	runOnce(t, c)
	all := allEvents(t, coll)
	for _, id := range ids {
		e := all[id]
		if e.Status != events.StatusFailed || e.FailedAt.IsZero() || e.Attempts != 1 {
			t.Errorf("event %s: status %s failedAt %s attempts %d; want FAILED after its only attempt", id, e.Status, e.FailedAt, e.Attempts)
		}
		if !strings.HasPrefix(e.LastError, "gave up after 1 attempts: ") || !strings.Contains(e.LastError, "unroutable") {
			t.Errorf("event %s: lastError %q, want \"gave up after 1 attempts: \" and the return kept", id, e.LastError)
		}
	}
	if got := testutil.ToFloat64(m.Failed.WithLabelValues(metrics.ReasonMaxAttempts)); got != 3 {
		t.Errorf("failed{reason=max_attempts} = %v, want 3", got)
	}
}

// faultPublisher is the real publisher with switches for what a healthy
// broker will not do on demand: it fails the messages fail picks with the
// error fail returns instead of sending them, sends the rest, and can
// report not ready. during, if set, runs after the sends and before
// Publish returns: the moment a batch's confirms are in but not yet written.
type faultPublisher struct {
	*broker.Publisher
	notReady error
	fail     func(events.Message) error
	during   func()
}

func (p *faultPublisher) Ready() error {
	if p.notReady != nil {
		return p.notReady
	}
	return p.Publisher.Ready()
}

func (p *faultPublisher) Publish(ctx context.Context, msgs []events.Message) []error {
	errs := make([]error, len(msgs))
	var send []events.Message
	var index []int
	for i, m := range msgs {
		if p.fail != nil {
			if err := p.fail(m); err != nil {
				errs[i] = err
				continue
			}
		}
		send = append(send, m)
		index = append(index, i)
	}
	if len(send) > 0 {
		for j, err := range p.Publisher.Publish(ctx, send) {
			errs[index[j]] = err
		}
	}
	if p.during != nil {
		p.during()
	}
	return errs
}

func TestRunOnceBrokerFaultRefundsAttempt(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		err    error
		reason string
	}{
		{fmt.Errorf("%w: channel closed before the confirm", events.ErrUnavailable), metrics.ReasonBrokerUnavailable},
		{fmt.Errorf("%w: context deadline exceeded", events.ErrUnconfirmed), metrics.ReasonUnconfirmed},
	} {
		t.Run(tt.reason, func(t *testing.T) {
			t.Parallel()
			r := setup(t)
			pub := &faultPublisher{Publisher: newPublisher(t, r.exchange)}
			c, m := newClaimer(t, r.store, pub, Config{MaxAttempts: 1})
			ids := insertEvents(t, r.coll, 20, "order.created")

			pub.fail = func(events.Message) error { return tt.err }
			runOnce(t, c)
			for id, e := range allEvents(t, r.coll) {
				if e.Status != events.StatusNew || e.Attempts != 0 || !e.RetryAt.IsZero() || !strings.Contains(e.LastError, tt.err.Error()) {
					t.Errorf("event %s after %v: status %s attempts %d retryAt %s lastError %q; want NEW, attempt refunded, no retry time, the error kept",
						id, tt.err, e.Status, e.Attempts, e.RetryAt, e.LastError)
				}
			}
			if got := testutil.ToFloat64(m.Released.WithLabelValues(tt.reason)); got != 20 {
				t.Errorf("released{reason=%s} = %v, want 20", tt.reason, got)
			}

			// The broker is back: with MaxAttempts 1, only a refunded
			// attempt lets these through.
			pub.fail = nil
			runOnce(t, c)
			if diff := cmp.Diff(once(ids), testenv.Receive(t, r.deliveries, ids, waitFor)); diff != "" {
				t.Errorf("messages received after the fault, by id (-want +got):\n%s", diff)
			}
			for id, e := range allEvents(t, r.coll) {
				if e.Status != events.StatusPublished || e.Attempts != 1 {
					t.Errorf("event %s: %s after %d attempts, want PUBLISHED after 1", id, e.Status, e.Attempts)
				}
			}
			if got := testutil.ToFloat64(m.Failed.WithLabelValues(metrics.ReasonMaxAttempts)); got != 0 {
				t.Errorf("failed{reason=max_attempts} = %v, want 0: a broker fault must not burn attempts", got)
			}
		})
	}
}

// lostRaceStore is a Store on which other replicas won every event of a
// full batch between this worker's find and its update.
type lostRaceStore struct{ Store }

func (lostRaceStore) ReadClaimable(context.Context, time.Time, events.ClaimLimit) ([]bson.Raw, bool, error) {
	return nil, true, nil
}

// idlePublisher is a ready Publisher that must not be asked to publish.
type idlePublisher struct{ t *testing.T }

func (idlePublisher) Ready() error { return nil }

func (p idlePublisher) Publish(context.Context, []events.Message) []error {
	p.t.Error("Publish called with nothing claimed")
	return nil
}

// A replica that loses a whole batch to others claims again at once: the
// backlog is still there, and waiting for the next tick would leave it idle.
func TestRunOnceLostRaceAsksForMore(t *testing.T) {
	t.Parallel()
	c, m := newClaimer(t, lostRaceStore{}, idlePublisher{t}, Config{})
	if more := runOnce(t, c); !more {
		t.Error("runOnce after losing a full batch to other replicas: more = false, want true")
	}
	if got := testutil.ToFloat64(m.Claimed); got != 0 {
		t.Errorf("claimed metric = %v, want 0", got)
	}
}

func TestRunOncePausedWhileBrokerNotReady(t *testing.T) {
	t.Parallel()
	store := mongotest.Store(t)
	coll := store.Collection()
	pub := &faultPublisher{Publisher: newPublisher(t, testenv.UniqueName(t, "ex_")),
		notReady: fmt.Errorf("%w: blocked by a broker alarm", events.ErrUnavailable)}
	c, m := newClaimer(t, store, pub, Config{})
	insertEvents(t, coll, 5, "order.created")

	more, err := c.runOnce(t.Context())
	if more || err != nil {
		t.Errorf("runOnce while not ready = %t, %v; want false, nil (a pause, not a failure)", more, err)
	}
	for id, e := range allEvents(t, coll) {
		if e.Status != events.StatusNew || e.Attempts != 0 {
			t.Errorf("event %s: %s after %d attempts; want untouched NEW", id, e.Status, e.Attempts)
		}
	}
	if got := testutil.ToFloat64(m.Claimed); got != 0 {
		t.Errorf("claimed = %v while the broker was not ready, want 0", got)
	}
}

func TestRunOnceNackRetriesOnlyThoseNacked(t *testing.T) {
	t.Parallel()
	r := setup(t)
	pub := &faultPublisher{Publisher: newPublisher(t, r.exchange)}
	pub.fail = func(m events.Message) error {
		if m.Type == "order.nacked" {
			return events.ErrNacked
		}
		return nil
	}
	c, m := newClaimer(t, r.store, pub, Config{})
	good := insertEvents(t, r.coll, 8, "order.created")
	nacked := insertEvents(t, r.coll, 4, "order.nacked")

	before := time.Now()
	runOnce(t, c)
	if diff := cmp.Diff(once(good), testenv.Receive(t, r.deliveries, good, waitFor)); diff != "" {
		t.Errorf("messages received, by id (-want +got):\n%s", diff)
	}
	all := allEvents(t, r.coll)
	for _, id := range good {
		if e := all[id]; e.Status != events.StatusPublished {
			t.Errorf("confirmed event %s: %s, want PUBLISHED", id, e.Status)
		}
	}
	for _, id := range nacked {
		e := all[id]
		if e.Status != events.StatusNew || e.Attempts != 1 || !e.RetryAt.After(before) || e.LastError != events.ErrNacked.Error() {
			t.Errorf("nacked event %s: status %s attempts %d retryAt %s lastError %q; want NEW, 1 attempt, a retry time, the nack",
				id, e.Status, e.Attempts, e.RetryAt, e.LastError)
		}
	}
	if got := testutil.ToFloat64(m.Released.WithLabelValues(metrics.ReasonNacked)); got != 4 {
		t.Errorf("released{reason=nacked} = %v, want 4", got)
	}
}

// A document whose worker-managed fields have the wrong type no longer
// stops the claim: it is FAILED in the run that reads it, counted as
// failed{reason=invalid}, and every valid event of the batch is relayed in
// that run; a null attempts is claimed as if absent.
func TestRunOnceManagedFieldOfWrongType(t *testing.T) {
	t.Parallel()
	r := setup(t)
	c, m := newClaimer(t, r.store, newPublisher(t, r.exchange), Config{BatchSize: 50})
	valid := insertEvents(t, r.coll, 20, "order.created")
	first := time.Now().Add(-time.Hour)
	bad := map[string]bson.E{
		"attempts-string": {Key: events.FieldAttempts, Value: "1"},
		"worker-number":   {Key: events.FieldWorkerID, Value: 7},
	}
	k := 0
	for id, f := range bad {
		doc := bson.D{{Key: "_id", Value: id}, {Key: "type", Value: "order.created"},
			{Key: "payload", Value: bson.D{{Key: "n", Value: 1}}}, {Key: "status", Value: "NEW"},
			{Key: "createdAt", Value: first.Add(time.Duration(5+k*5) * time.Millisecond)}, f}
		if _, err := r.coll.InsertOne(t.Context(), doc); err != nil {
			t.Fatal(err)
		}
		k++
	}
	nullDoc := bson.D{{Key: "_id", Value: "attempts-null"}, {Key: "type", Value: "order.created"},
		{Key: "payload", Value: bson.D{{Key: "n", Value: 1}}}, {Key: "status", Value: "NEW"},
		{Key: "createdAt", Value: first.Add(12 * time.Millisecond)}, {Key: events.FieldAttempts, Value: nil}}
	if _, err := r.coll.InsertOne(t.Context(), nullDoc); err != nil {
		t.Fatal(err)
	}

	runOnce(t, c)
	want := append(slices.Clone(valid), "attempts-null")
	if diff := cmp.Diff(once(want), testenv.Receive(t, r.deliveries, want, waitFor)); diff != "" {
		t.Errorf("messages received, by id (-want +got):\n%s", diff)
	}
	for _, id := range want {
		var e stored
		if err := r.coll.FindOne(t.Context(), bson.D{{Key: "_id", Value: storedID(id)}}).Decode(&e); err != nil {
			t.Fatalf("find %s: %v", id, err)
		}
		if e.Status != events.StatusPublished || e.Attempts != 1 {
			t.Errorf("event %s: %s after %d attempts, want PUBLISHED after 1", id, e.Status, e.Attempts)
		}
	}
	for id, f := range bad {
		raw, err := r.coll.FindOne(t.Context(), bson.D{{Key: "_id", Value: id}}).Raw()
		if err != nil {
			t.Fatalf("find %s: %v", id, err)
		}
		status, lastError := raw.Lookup("status").StringValue(), raw.Lookup("lastError").StringValue()
		if status != string(events.StatusFailed) || !strings.Contains(lastError, `"`+f.Key+`"`) {
			t.Errorf("event %s: %s, lastError %q; want FAILED naming %s", id, status, lastError, f.Key)
		}
	}
	if got := testutil.ToFloat64(m.Failed.WithLabelValues(metrics.ReasonInvalid)); got != float64(len(bad)) {
		t.Errorf("failed{reason=invalid} = %v, want %d", got, len(bad))
	}
	if got := testutil.ToFloat64(m.Claimed); got != float64(len(want)) {
		t.Errorf("claimed = %v, want %d", got, len(want))
	}
}

// storedID is the _id of an event named by its message id.
func storedID(s string) any {
	if id, err := bson.ObjectIDFromHex(s); err == nil {
		return id
	}
	return s
}
