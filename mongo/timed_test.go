package mongo_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
)

// periodicBudget is the deadline the test gives each periodic read, as
// the jobs do with their own timeouts.
const periodicBudget = 20 * time.Second

// TestPeriodicCommandsCarryMaxTimeMS: every command of the periodic jobs'
// store calls (Stats, Held, RecoverStale, DeletePublished) carries a
// server-side time limit no longer than the caller's deadline, finds
// included, which Collection.Find would send without one.
func TestPeriodicCommandsCarryMaxTimeMS(t *testing.T) {
	t.Parallel()
	s, rec := mongotest.RecordingStore(t)
	coll := s.Collection()
	insert(t, coll,
		ev("n1", events.StatusNew, ago(time.Minute), agg("a")...),
		ev("r1", events.StatusNew, ago(2*time.Minute), append(agg("a"), field(events.FieldRetryAt, base.Add(time.Hour)))...),
		ev("f1", events.StatusFailed, ago(time.Hour), agg("b")...),
		ev("p1", events.StatusProcessing, ago(time.Hour), field(events.FieldProcessingAt, ago(time.Hour)), field(events.FieldAttempts, 1)),
		ev("d1", events.StatusPublished, ago(48*time.Hour), field(events.FieldPublishedAt, ago(47*time.Hour))),
	)
	rec.Take()

	calls := []struct {
		name string
		call func(ctx context.Context) error
		want []string // commands it must send
	}{
		// The size estimate is a count on MongoDB, collStats on FerretDB.
		{"Stats by index", func(ctx context.Context) error {
			mongo.SetOnePassStats(s, false)
			_, err := s.Stats(ctx, ago(time.Minute))
			return err
		}, []string{"aggregate", "count|collStats", "find"}},
		{"Stats in one pass", func(ctx context.Context) error {
			mongo.SetOnePassStats(s, true)
			_, err := s.Stats(ctx, ago(time.Minute))
			return err
		}, []string{"count|collStats", "find"}},
		{"Held", func(ctx context.Context) error { _, err := s.Held(ctx, base, true); return err }, []string{"find"}},
		{"RecoverStale", func(ctx context.Context) error {
			_, _, err := s.RecoverStale(ctx, ago(time.Minute), base, 5)
			return err
		}, []string{"aggregate", "update"}},
		{"DeletePublished", func(ctx context.Context) error { _, err := s.DeletePublished(ctx, ago(24*time.Hour), 10); return err }, []string{"find", "delete"}},
	}
	for _, c := range calls {
		ctx, cancel := context.WithTimeout(t.Context(), periodicBudget)
		err := c.call(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		seen := map[string]bool{}
		for _, sent := range rec.Take() {
			switch sent.Name {
			case "getMore", "killCursors", "endSessions":
				continue // a getMore runs under its find's limit
			}
			seen[sent.Name] = true
			ms, ok := maxTimeMS(sent.Command)
			if !ok || ms <= 0 || ms > periodicBudget.Milliseconds() {
				t.Errorf("%s sent %s with maxTimeMS %v (present %t), want 1 to %d ms: %s", c.name, sent.Name, ms, ok, periodicBudget.Milliseconds(), sent.Command)
			}
		}
		for _, want := range c.want {
			name, other, _ := strings.Cut(want, "|")
			if !seen[name] && !seen[other] {
				t.Errorf("%s sent no %s (sent %v): the test no longer checks it", c.name, want, seen)
			}
		}
	}

	// Why the store's finds do not go through Collection.Find: under the
	// same deadline, driver v2 sends that find without any limit.
	ctx, cancel := context.WithTimeout(t.Context(), periodicBudget)
	defer cancel()
	cur, err := coll.Find(ctx, bson.D{{Key: events.FieldStatus, Value: events.StatusNew}})
	if err != nil {
		t.Fatal(err)
	}
	_ = cur.Close(ctx)
	finds := 0
	for _, sent := range rec.Take() {
		if sent.Name != "find" {
			continue
		}
		finds++
		if _, ok := maxTimeMS(sent.Command); ok {
			t.Errorf("Collection.Find sent maxTimeMS under a deadline (%s): the driver changed, and timedFind may go", sent.Command)
		}
	}
	if finds != 1 {
		t.Errorf("Collection.Find sent %d finds, want 1", finds)
	}
}

// maxTimeMS reads the command's maxTimeMS, of whatever number type.
func maxTimeMS(cmd bson.Raw) (int64, bool) {
	v, err := cmd.LookupErr("maxTimeMS")
	if err != nil {
		return 0, false
	}
	if n, ok := v.AsInt64OK(); ok {
		return n, true
	}
	return 0, true
}

// TestHeldStopsAtItsWindow: Held reads at most its window of NEW events,
// oldest first, and says when the count it gives is a lower bound.
func TestHeldStopsAtItsWindow(t *testing.T) {
	t.Parallel()
	eachStatsStrategy(t, testHeldStopsAtItsWindow)
}

func testHeldStopsAtItsWindow(t *testing.T, s *mongo.Store, coll *driver.Collection) {
	mongo.SetHeldWindow(s, 4)
	at := ago(time.Hour)
	var docs []bson.D
	for i := range 6 { // six held aggregates, each with one event waiting
		key := fmt.Sprintf("k%d", i)
		docs = append(docs,
			ev("r"+key, events.StatusNew, at, append(agg(key), field(events.FieldRetryAt, base.Add(time.Hour)))...),
			ev("w"+key, events.StatusNew, at.Add(time.Duration(i+1)*time.Millisecond), agg(key)...))
	}
	insert(t, coll, docs...)
	got, err := s.Held(t.Context(), base, false)
	if err != nil {
		t.Fatal(err)
	}
	// The window reads the six holders (createdAt at) first: their own
	// events are not waiting, so none of the waiting ones is counted, and
	// the result says it is capped.
	if !got.Capped || got.Aggregates > 6 {
		t.Errorf("Held with a window of 4 = %+v, want Capped and at most the 6 real aggregates", got)
	}
	mongo.SetHeldWindow(s, 12)
	got, err = s.Held(t.Context(), base, false)
	if err != nil {
		t.Fatal(err)
	}
	if got.Capped || got.Aggregates != 6 || !got.OldestWaiting.Equal(at.Add(time.Millisecond)) {
		t.Errorf("Held with a window of 12 = %+v, want 6 aggregates, oldest waiting %s, not capped", got, at.Add(time.Millisecond))
	}
}
