package claim

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
)

// batchOf builds a claimed batch, in claim order, from "id:aggregate"
// pairs; an empty aggregate is an unordered event.
func batchOf(t *testing.T, spec ...[2]string) []events.Claimed {
	t.Helper()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	out := make([]events.Claimed, len(spec))
	for i, s := range spec {
		d := events.Draft{ID: s[0], Type: "t", Payload: bson.D{{Key: "n", Value: i}}}
		if s[1] != "" {
			d.AggregateType, d.AggregateID = "order", s[1]
		}
		doc, err := d.Document(at.Add(time.Duration(i) * time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		raw := testenv.Marshal(t, doc)
		out[i] = events.Claimed{ID: s[0], Attempts: 1, Doc: raw}
	}
	return out
}

func TestPlanRounds(t *testing.T) {
	t.Parallel()
	batch := batchOf(t,
		[2]string{"a1", "A"}, [2]string{"u1", ""}, [2]string{"b1", "B"}, [2]string{"a2", "A"},
		[2]string{"a3", "A"}, [2]string{"u2", ""}, [2]string{"b2", "B"}, [2]string{"c1", "C"})
	rounds, keys := planRounds(batch)
	ids := make([][]string, len(rounds))
	for r, round := range rounds {
		for _, i := range round {
			ids[r] = append(ids[r], batch[i].ID.(string))
		}
	}
	want := [][]string{{"a1", "u1", "b1", "u2", "c1"}, {"a2", "b2"}, {"a3"}}
	if diff := cmp.Diff(want, ids); diff != "" {
		t.Errorf("rounds (-want +got):\n%s", diff)
	}
	if keys[0] != events.Key("order", "A") || keys[1] != "" {
		t.Errorf("keys = %q", keys)
	}
	if rounds, _ := planRounds(nil); len(rounds) != 0 {
		t.Errorf("planRounds(nil) = %v", rounds)
	}
}

// roundPublisher confirms everything except what fail says, and records
// each Publish call's message ids.
type roundPublisher struct {
	calls [][]string
	fail  map[string]error
}

func (p *roundPublisher) Ready() error { return nil }

func (p *roundPublisher) Publish(_ context.Context, msgs []events.Message) []error {
	var ids []string
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		ids = append(ids, m.ID)
		errs[i] = p.fail[m.ID]
	}
	p.calls = append(p.calls, ids)
	return errs
}

// TestPublishInRoundsStopsTheKey: a returned or nacked event stops the
// later events of its aggregate in the batch, which are never sent; other
// aggregates and unordered events go on.
func TestPublishInRoundsStopsTheKey(t *testing.T) {
	t.Parallel()
	batch := batchOf(t,
		[2]string{"a1", "A"}, [2]string{"b1", "B"}, [2]string{"u1", ""}, [2]string{"a2", "A"},
		[2]string{"b2", "B"}, [2]string{"a3", "A"}, [2]string{"b3", "B"})
	pub := &roundPublisher{fail: map[string]error{
		"a1": events.ErrReturned,
		"b2": events.ErrNacked,
	}}
	c, _ := newClaimer(t, nil, pub, Config{})
	outcomes := make([]outcome, len(batch))
	msgs := make([]*events.Message, len(batch))
	for i, cl := range batch {
		outcomes[i] = outcome{id: cl.ID, attempts: 1}
		m, err := events.NewMessage(cl.Doc, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		msgs[i] = &m
	}
	c.publishInRounds(t.Context(), batch, msgs, outcomes, time.Now().Add(time.Hour))
	wantCalls := [][]string{{"a1", "b1", "u1"}, {"b2"}}
	if diff := cmp.Diff(wantCalls, pub.calls); diff != "" {
		t.Errorf("Publish calls (-want +got):\n%s", diff)
	}
	got := map[string]string{}
	for _, o := range outcomes {
		switch {
		case o.err == nil:
			got[o.id.(string)] = "confirmed"
		case errors.Is(o.err, errHeldBack):
			got[o.id.(string)] = "held back"
		default:
			got[o.id.(string)] = "failed"
		}
	}
	want := map[string]string{"a1": "failed", "a2": "held back", "a3": "held back",
		"b1": "confirmed", "b2": "failed", "b3": "held back", "u1": "confirmed"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	// A held-back event goes back to NEW with its attempt refunded.
	_, releases := c.policy.plan([]outcome{{id: "a2", attempts: 1, err: errHeldBack}}, time.Now())
	if len(releases) != 1 || releases[0].Status != events.StatusNew || !releases[0].Refund || !releases[0].RetryAt.IsZero() {
		t.Errorf("release of a held-back event = %+v, want NEW, refunded, no retry time", releases)
	}
}
