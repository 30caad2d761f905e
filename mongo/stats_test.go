package mongo_test

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

func TestStats(t *testing.T) {
	t.Parallel()
	eachStatsStrategy(t, testStats)
}

func testStats(t *testing.T, s *mongo.Store, coll *driver.Collection) {

	st, err := s.Stats(t.Context(), base)
	if err != nil {
		t.Fatalf("Stats on an empty outbox: %v", err)
	}
	want := events.Stats{Counts: map[events.Status]int64{
		events.StatusNew: 0, events.StatusProcessing: 0, events.StatusPublished: 0, events.StatusFailed: 0,
		events.StatusUnknown: 0,
	}}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("Stats on an empty outbox (-want +got):\n%s", diff)
	}
	if age := st.OldestNewAge(base); age != 0 {
		t.Errorf("OldestNewAge with no NEW events = %s, want 0", age)
	}

	insert(t, coll,
		ev("n1", events.StatusNew, ago(3*time.Minute)),
		ev("n2", events.StatusNew, ago(10*time.Minute)),
		ev("n3", events.StatusNew, ago(time.Minute), field(events.FieldRetryAt, base.Add(time.Minute))),
		ev("p1", events.StatusProcessing, ago(time.Hour), field(events.FieldProcessingAt, ago(2*time.Minute))),
		ev("p2", events.StatusProcessing, ago(time.Hour), field(events.FieldProcessingAt, ago(10*time.Second))),
		ev("d1", events.StatusPublished, ago(48*time.Hour), field(events.FieldPublishedAt, ago(47*time.Hour))),
		ev("d2", events.StatusPublished, ago(time.Hour), field(events.FieldPublishedAt, ago(time.Hour))),
		ev("d3", events.StatusPublished, ago(time.Hour), field(events.FieldPublishedAt, ago(time.Hour))),
		ev("f1", events.StatusFailed, ago(72*time.Hour)),
	)
	st, err = s.Stats(t.Context(), ago(time.Minute))
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	want = events.Stats{
		Counts: map[events.Status]int64{
			events.StatusNew: 3, events.StatusProcessing: 2, events.StatusPublished: 3, events.StatusFailed: 1,
			events.StatusUnknown: 0,
		},
		OldestNew: ago(10 * time.Minute), // older PUBLISHED and FAILED events do not count
		Stale:     1,
	}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
	if age := st.OldestNewAge(base); age != 10*time.Minute {
		t.Errorf("OldestNewAge = %s, want 10m", age)
	}
}

// TestStatsUnknownStatus: events of no known status are counted under
// events.StatusUnknown, each shape of it, and not as PUBLISHED (which is
// estimated from the collection's size less the others).
func TestStatsUnknownStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status any // unsetStatus: no status field
	}{
		{"lower case", "new"},
		{"other word", "DONE"},
		{"empty", ""},
		{"number", 1},
		{"null", nil},
		{"missing", unsetStatus},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			eachStatsStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
				odd := ev("odd", events.StatusNew, ago(time.Hour))
				for i := range odd {
					if odd[i].Key == events.FieldStatus {
						odd[i].Value = tt.status
					}
				}
				if tt.status == unsetStatus {
					odd = slices.DeleteFunc(odd, func(e bson.E) bool { return e.Key == events.FieldStatus })
				}
				insert(t, coll, odd,
					ev("n1", events.StatusNew, ago(time.Minute)),
					ev("d1", events.StatusPublished, ago(time.Hour), field(events.FieldPublishedAt, ago(time.Hour))),
				)
				st, err := s.Stats(t.Context(), ago(time.Minute))
				if err != nil {
					t.Fatalf("Stats: %v", err)
				}
				want := map[events.Status]int64{
					events.StatusNew: 1, events.StatusProcessing: 0, events.StatusPublished: 1, events.StatusFailed: 0,
					events.StatusUnknown: 1,
				}
				if diff := cmp.Diff(want, st.Counts); diff != "" {
					t.Errorf("Counts with status %#v (-want +got):\n%s", tt.status, diff)
				}
			})
		})
	}
}

// unsetStatus, as TestStatsUnknownStatus's status, leaves the field out.
const unsetStatus = "\x00unset"
