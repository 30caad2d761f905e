package main

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
)

// orderPlan is the shape of an ordering backlog.
type orderPlan struct {
	aggregates   int // aggregates of perAggregate events each
	perAggregate int
	unordered    int // events without aggregateId, spread among the others
}

var (
	orderPlanFerret = orderPlan{aggregates: 40, perAggregate: 20, unordered: 60}
	orderPlanMongo  = orderPlan{aggregates: 500, perAggregate: 40, unordered: 10000}
)

// Aggregates and positions with a part to play. Aggregates latePlayers
// have their event lateAt unroutable at first; requeuedAggregate and
// skippedAggregate have their event poisonAt FAILED (a CC header that is
// not an array) until the operator fixes and requeues the first, and skips
// the second. Aggregates whose number ends in tiedDigit have pairs of
// events with the same createdAt, ordered by _id.
var latePlayers = []int{1, 2, 3, 4, 5}

const (
	lateAt            = 5
	requeuedAggregate = 6
	skippedAggregate  = 7
	poisonAt          = 8
	tiedDigit         = 3
	lateUnordered     = 2 // unordered events that are unroutable at first
)

// plannedEvent is one event of an ordering backlog.
type plannedEvent struct {
	id        string
	aggregate string // "" for an event without aggregateId
	pos       int    // its place in its aggregate
	createdAt time.Time
	typ       string
	poison    bool
}

// plan builds the backlog: round j holds the j-th event of every aggregate,
// aggregates shuffled within the round, unordered events sprinkled in;
// createdAt grows by a millisecond per event, except that the odd events of
// the tied aggregates share the createdAt of the event before them.
func (p orderPlan) plan(start time.Time) []plannedEvent {
	rng := rand.New(rand.NewPCG(1, 2))
	total := p.aggregates*p.perAggregate + p.unordered
	out := make([]plannedEvent, 0, total)
	tick := 0
	next := func() time.Time { tick++; return start.Add(time.Duration(tick) * time.Millisecond) }
	createdOf := map[string]time.Time{} // of each aggregate's latest event
	unordered := 0
	addUnordered := func() {
		typ := typeNote
		if unordered < lateUnordered {
			typ = typeLate
		}
		out = append(out, plannedEvent{id: fmt.Sprintf("u-%05d", unordered), createdAt: next(), typ: typ})
		unordered++
	}
	perRound := (p.unordered + p.perAggregate - 1) / p.perAggregate
	for j := range p.perAggregate {
		for _, a := range rng.Perm(p.aggregates) {
			e := plannedEvent{
				id:        fmt.Sprintf("o-%03d-%03d", a, j),
				aggregate: fmt.Sprintf("agg-%03d", a),
				pos:       j,
				createdAt: next(),
				typ:       typeStep,
			}
			if a%10 == tiedDigit && j%2 == 1 {
				// Same createdAt as event j-1, whose _id sorts first.
				e.createdAt = createdOf[e.aggregate]
			}
			createdOf[e.aggregate] = e.createdAt
			if j == lateAt && slices.Contains(latePlayers, a) {
				e.typ = typeLate
			}
			if j == poisonAt && (a == requeuedAggregate || a == skippedAggregate) {
				e.poison = true
			}
			out = append(out, e)
		}
		for range perRound {
			if unordered < p.unordered {
				addUnordered()
			}
		}
	}
	return out
}

// document is e as a producer would write it, a poison one with a CC
// header that is not an array (which the worker fails as invalid).
func (e plannedEvent) document(t *testing.T) bson.D {
	t.Helper()
	d := events.Draft{ID: e.id, Type: e.typ, Payload: bson.D{{Key: "pos", Value: e.pos}}}
	if e.aggregate != "" {
		d.AggregateType, d.AggregateID = "e2e", e.aggregate
	}
	doc, err := d.Document(e.createdAt)
	if err != nil {
		t.Fatal(err)
	}
	if e.poison {
		doc = setFields(doc, bson.E{Key: events.FieldHeaders, Value: bson.D{{Key: "CC", Value: "not-an-array"}}})
	}
	return doc
}

// aggregateOf returns the id of aggregate number a.
func aggregateOf(a int) string { return fmt.Sprintf("agg-%03d", a) }

// insertPlanned inserts the events in a shuffled order: only createdAt and
// _id may decide the order, never the order of insertion. Producers commit
// the events of one aggregate in createdAt order; the whole backlog is
// written before any worker starts, which keeps that promise.
func insertPlanned(ctx context.Context, t *testing.T, coll *driver.Collection, planned []plannedEvent) {
	t.Helper()
	docs := make([]any, len(planned))
	for i, e := range planned {
		docs[i] = e.document(t)
	}
	rand.New(rand.NewPCG(3, 4)).Shuffle(len(docs), func(i, j int) { docs[i], docs[j] = docs[j], docs[i] })
	for chunk := range slices.Chunk(docs, insertChunk) {
		if _, err := coll.InsertMany(ctx, chunk, options.InsertMany().SetOrdered(false)); err != nil {
			t.Fatalf("insert events: %v", err)
		}
	}
}

// aggregateNumber is the inverse of aggregateOf; -1 for no aggregate.
func aggregateNumber(agg string) int {
	var a int
	if _, err := fmt.Sscanf(agg, "agg-%d", &a); err != nil {
		return -1
	}
	return a
}

// orderViolations checks the ordering guarantee on what a consumer saw:
// first maps each message id to the position of its first delivery. For
// each aggregate, ordered by createdAt then _id, an event's first delivery
// must come after the first delivery of every earlier event of the
// aggregate that was delivered at all. Duplicates do not count: a consumer
// that deduplicates by message id never sees them.
func orderViolations(planned []plannedEvent, first map[string]int) []string {
	byAggregate := map[string][]plannedEvent{}
	for _, e := range planned {
		if e.aggregate != "" {
			byAggregate[e.aggregate] = append(byAggregate[e.aggregate], e)
		}
	}
	var out []string
	for _, agg := range slices.Sorted(maps.Keys(byAggregate)) {
		evs := byAggregate[agg]
		slices.SortFunc(evs, func(a, b plannedEvent) int {
			if c := a.createdAt.Compare(b.createdAt); c != 0 {
				return c
			}
			return strings.Compare(a.id, b.id)
		})
		latest, latestID := -1, ""
		for _, e := range evs {
			at, ok := first[e.id]
			if !ok {
				continue
			}
			if at < latest {
				out = append(out, fmt.Sprintf("%s: %s first arrived at #%d, before the earlier %s (#%d)", agg, e.id, at, latestID, latest))
				continue
			}
			latest, latestID = at, e.id
		}
	}
	return out
}

func TestOrderViolations(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	planned := []plannedEvent{
		{id: "a-1", aggregate: "a", createdAt: t0},
		{id: "a-2", aggregate: "a", createdAt: t0.Add(time.Millisecond)},
		{id: "a-3", aggregate: "a", createdAt: t0.Add(time.Millisecond)}, // tie: after a-2 by _id
		{id: "b-1", aggregate: "b", createdAt: t0.Add(time.Millisecond)},
		{id: "b-2", aggregate: "b", createdAt: t0.Add(2 * time.Millisecond)},
		{id: "u-1", createdAt: t0.Add(5 * time.Millisecond)},
	}
	tests := []struct {
		name  string
		first map[string]int
		want  int
	}{
		{"in order, interleaved", map[string]int{"a-1": 0, "b-1": 1, "a-2": 2, "u-1": 3, "b-2": 4, "a-3": 5}, 0},
		{"unordered event anywhere", map[string]int{"u-1": 0, "a-1": 1, "a-2": 2, "a-3": 3, "b-1": 4, "b-2": 5}, 0},
		{"skipped event missing", map[string]int{"a-1": 0, "a-3": 1, "b-1": 2, "b-2": 3}, 0},
		{"inversion", map[string]int{"a-2": 0, "a-1": 1, "a-3": 2, "b-1": 3, "b-2": 4}, 1},
		{"tie broken the wrong way", map[string]int{"a-1": 0, "a-3": 1, "a-2": 2, "b-1": 3, "b-2": 4}, 1},
		{"later event first", map[string]int{"b-2": 0, "a-1": 1, "a-2": 2, "a-3": 3, "b-1": 4}, 1},
		{"first event last", map[string]int{"a-2": 0, "a-3": 1, "a-1": 2}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := orderViolations(planned, tt.first)
			if len(got) != tt.want {
				t.Errorf("orderViolations = %q, want %d violations", got, tt.want)
			}
		})
	}
}

func TestOrderPlan(t *testing.T) {
	t.Parallel()
	p := orderPlan{aggregates: 20, perAggregate: 10, unordered: 30}
	planned := p.plan(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	counts := map[string]int{}
	for _, e := range planned {
		counts[e.typ]++
	}
	want := map[string]int{typeStep: 200 - len(latePlayers), typeLate: len(latePlayers) + lateUnordered, typeNote: 30 - lateUnordered}
	if diff := cmp.Diff(want, counts); diff != "" {
		t.Errorf("events by type (-want +got):\n%s", diff)
	}
	// Within an aggregate, position order is (createdAt, _id) order.
	last := map[string]plannedEvent{}
	for _, e := range planned {
		if e.aggregate == "" {
			continue
		}
		if prev, ok := last[e.aggregate]; ok {
			if e.createdAt.Before(prev.createdAt) || (e.createdAt.Equal(prev.createdAt) && e.id < prev.id) {
				t.Errorf("%s comes after %s but sorts before it", e.id, prev.id)
			}
		}
		last[e.aggregate] = e
	}
	var poison int
	for _, e := range planned {
		if e.poison {
			poison++
		}
	}
	if poison != 2 {
		t.Errorf("%d poison events, want 2", poison)
	}
}
