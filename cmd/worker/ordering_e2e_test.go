package main

// End-to-end tests of per-aggregate ordering (docs/ordering.md): worker
// processes relay interleaved aggregates while one of them is killed, some
// events are unroutable for a while and one event of an aggregate is
// FAILED until an operator requeues or skips it. A single consumer of a
// single queue checks, from what it receives, that the first delivery of
// every event comes after the first delivery of every earlier event of its
// aggregate. The scenarios take a stack, so that container_test.go runs
// them against real MongoDB too.

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// Routing keys of the ordering scenarios. The consumer's queue is bound to
// typeStep and typeNote from the start and to typeLate only later, so that
// events of typeLate come back unroutable and are retried with backoff.
const (
	typeStep = "ord.step"
	typeLate = "ord.late"
	typeNote = "misc.note"
)

// Settings of the ordering workers: fast schedules, and the shortest stale
// threshold the worker accepts with this publish timeout, so that a killed
// worker's claims come back within seconds.
const (
	orderStaleAfter     = 13 * time.Second
	orderPublishTimeout = 2 * time.Second
	orderBatchSize      = 25
)

// TestE2EOrdering runs the ordering scenarios against embedded FerretDB (or
// the MongoDB in OUTBOX_TEST_MONGO_URI) and the local RabbitMQ.
func TestE2EOrdering(t *testing.T) {
	t.Parallel()
	s := stack{
		name:         "ferretdb",
		mongoURI:     testenv.MongoURI(t),
		amqpURL:      testenv.AMQPURL(t),
		atomicClaims: !testenv.IsFerretDB(),
	}
	if s.atomicClaims {
		s.name = "mongodb"
	}
	runOrderingScenarios(t, s)
}

// runOrderingScenarios runs every ordering scenario against s, in
// parallel.
func runOrderingScenarios(t *testing.T, s stack) {
	plan := orderPlanFerret
	if s.atomicClaims {
		// MongoDB relays the small plan before a worker can be caught
		// holding a claim; see mongoMidBacklog.
		plan = orderPlanMongo
	}
	t.Run("aggregate", func(t *testing.T) {
		t.Parallel()
		orderingScenario(t, s, plan, "aggregate")
	})
	t.Run("none", func(t *testing.T) {
		t.Parallel()
		orderingScenario(t, s, plan, "none")
	})
	t.Run("share", func(t *testing.T) {
		t.Parallel()
		n := e2eEvents(t)
		if s.atomicClaims {
			n = max(n, mongoMidBacklog)
		}
		shareScenario(t, s, 3, n)
	})
}

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

// orderingScenario: three workers relay the planned backlog with
// OUTBOX_ORDERING set to ordering; one is killed holding a claim, the late events
// become routable after their first retries, and the two poison events are
// requeued (after a fix) and skipped. With ordering "aggregate", every
// aggregate arrives in order and waits behind its unroutable and FAILED
// events; with "none" everything arrives, in whatever order.
func orderingScenario(t *testing.T, s stack, p orderPlan, ordering string) {
	ordered := ordering == "aggregate"
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(p.aggregates*p.perAggregate+p.unordered)+time.Minute)
	defer cancel()
	db := s.database(t)
	coll := db.Collection(mongo.CollectionDefault)
	exchange := testenv.UniqueName(t, "ex_")
	r := consumeOrdered(t, s, exchange, typeStep, typeNote)

	planned := p.plan(time.Now().UTC().Add(-time.Minute).Truncate(time.Millisecond))
	insertPlanned(ctx, t, coll, planned)
	byID := make(map[string]plannedEvent, len(planned))
	for _, e := range planned {
		byID[e.id] = e
	}
	requeuedPoison := fmt.Sprintf("o-%03d-%03d", requeuedAggregate, poisonAt)
	skippedPoison := fmt.Sprintf("o-%03d-%03d", skippedAggregate, poisonAt)
	// behindPoison are the events that must wait for the operator.
	var behindPoison, rest []string
	for _, e := range planned {
		switch {
		case e.poison:
		case ordered && (e.aggregate == aggregateOf(requeuedAggregate) || e.aggregate == aggregateOf(skippedAggregate)) && e.pos > poisonAt:
			behindPoison = append(behindPoison, e.id)
		default:
			rest = append(rest, e.id)
		}
	}

	procs := make([]*workerProc, 3)
	for i := range procs {
		id := fmt.Sprintf("%s-w%d", db.Name(), i)
		env := s.workerEnv(db.Name(), exchange, id)
		for k, v := range map[string]string{
			"OUTBOX_ORDERING":              ordering,
			"OUTBOX_ORDERING_AFTER_FAILED": "wait",
			"OUTBOX_BATCH_SIZE":            fmt.Sprint(orderBatchSize),
			"OUTBOX_CLAIM_SCHEDULE":        "@every 100ms",
			"OUTBOX_RECOVERY_SCHEDULE":     "@every 1s",
			"OUTBOX_STALE_AFTER":           orderStaleAfter.String(),
			"OUTBOX_PUBLISH_TIMEOUT":       orderPublishTimeout.String(),
			"OUTBOX_RETRY_MIN":             "300ms",
			"OUTBOX_RETRY_MAX":             "1s",
			"OUTBOX_MAX_ATTEMPTS":          "50",
		} {
			env[k] = v
		}
		procs[i] = startWorker(t, id, env)
	}
	victim := procs[0]

	// 1. Kill a worker while it holds a claim: its batch may have reached
	// the broker unconfirmed and will be published again.
	if err := r.waitDistinct(ctx, len(planned)/8); err != nil {
		t.Fatalf("before the kill: %v; documents by status: %v", err, statusCounts(t, coll))
	}
	stranded := killHolding(ctx, t, coll, r.receiver, victim, victim.name, len(planned))
	t.Logf("killed %s holding %d events; %d of %d events received", victim.name, len(stranded), r.distinct(), len(planned))

	// 2. The late events have been returned and retried with backoff:
	// nothing after them in their aggregate may have arrived. Then they
	// become routable.
	var late []string
	for _, e := range planned {
		if e.typ == typeLate {
			late = append(late, e.id)
		}
	}
	waitCount(ctx, t, coll, bson.D{
		{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: late}}},
		{Key: events.FieldAttempts, Value: bson.D{{Key: "$gte", Value: 2}}},
	}, int64(len(late)))
	if ordered {
		var overtook []string
		for _, id := range r.arrived() {
			e := byID[id]
			if slices.Contains(latePlayers, aggregateNumber(e.aggregate)) && e.pos > lateAt {
				overtook = append(overtook, id)
			}
		}
		if len(overtook) > 0 {
			slices.Sort(overtook)
			t.Errorf("%d events arrived while an earlier event of their aggregate was backing off unroutable, e.g. %v", len(overtook), overtook[:min(5, len(overtook))])
		}
	}
	r.bind(t, typeLate)

	// 3. Everything but the poison events and what waits behind them
	// arrives; the poison events are FAILED.
	if err := r.waitIDs(ctx, rest); err != nil {
		t.Fatalf("%v; documents by status: %v", err, statusCounts(t, coll))
	}
	waitCount(ctx, t, coll, bson.D{
		{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: []string{requeuedPoison, skippedPoison}}}},
		{Key: events.FieldStatus, Value: events.StatusFailed},
	}, 2)
	env := map[string]string{"OUTBOX_MONGO_URI": s.mongoURI, "OUTBOX_MONGO_DATABASE": db.Name()}
	if ordered {
		// Settled: nothing PROCESSING is left to count as held.
		waitCount(ctx, t, coll, bson.D{
			{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: rest}}},
			{Key: events.FieldStatus, Value: events.StatusPublished},
		}, int64(len(rest)))
		if got := r.arrivedOf(behindPoison); len(got) > 0 {
			t.Errorf("%d events arrived although an earlier event of their aggregate is FAILED, e.g. %v", len(got), got[:min(5, len(got))])
		}
		if c, err := coll.CountDocuments(ctx, bson.D{
			{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: behindPoison}}},
			{Key: events.FieldStatus, Value: events.StatusNew},
		}); err != nil || c != int64(len(behindPoison)) {
			t.Errorf("%d of the %d events behind a FAILED event are NEW (error %v), want all", c, len(behindPoison), err)
		}
		out := runTool(ctx, t, env, 0, "stats")
		if re := `(?m)^held aggregates\s+2\s*$`; !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("worker stats does not show the 2 held aggregates (%s):\n%s", re, out)
		}
	}

	// 4. The operator fixes one poison event and requeues it, and skips
	// the other; the rest of both aggregates flows.
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: events.FieldID, Value: requeuedPoison}},
		bson.D{{Key: "$unset", Value: bson.D{{Key: events.FieldHeaders + ".CC", Value: ""}}}}); err != nil {
		t.Fatalf("fix %s: %v", requeuedPoison, err)
	}
	runTool(ctx, t, env, 0, "requeue", "--id", requeuedPoison)
	runTool(ctx, t, env, 0, "skip", "--id", skippedPoison, "--by", "e2e-operator", "--reason", "poison header in a test")
	if err := r.waitIDs(ctx, append(slices.Clone(behindPoison), requeuedPoison)); err != nil {
		t.Fatalf("after the requeue and the skip: %v; documents by status: %v", err, statusCounts(t, coll))
	}
	waitCount(ctx, t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}}, int64(len(planned)-1))
	stopWorkers(t, procs[1:]...)
	r.drain(t)

	// The skipped event stays FAILED, saying who skipped it, when and why.
	var skipped struct {
		Status     events.Status `bson:"status"`
		SkippedBy  string        `bson:"skippedBy"`
		SkipReason string        `bson:"skipReason"`
		SkippedAt  *time.Time    `bson:"skippedAt"`
	}
	if err := coll.FindOne(ctx, bson.D{{Key: events.FieldID, Value: skippedPoison}}).Decode(&skipped); err != nil {
		t.Fatalf("find %s: %v", skippedPoison, err)
	}
	if skipped.Status != events.StatusFailed || skipped.SkippedBy != "e2e-operator" ||
		skipped.SkipReason != "poison header in a test" || skipped.SkippedAt == nil {
		t.Errorf("skipped event = %+v, want FAILED, skippedBy e2e-operator, skipReason and skippedAt set", skipped)
	}

	// What the consumer saw.
	wantIDs := make([]string, 0, len(planned)-1)
	for _, e := range planned {
		if e.id != skippedPoison {
			wantIDs = append(wantIDs, e.id)
		}
	}
	r.checkExactly(t, wantIDs)
	isStranded := make(map[string]bool, len(stranded))
	for _, id := range stranded {
		isStranded[idString(id)] = true
	}
	dups := r.duplicates()
	var unexpected []string
	for _, id := range slices.Sorted(maps.Keys(dups)) {
		if !isStranded[id] {
			unexpected = append(unexpected, fmt.Sprintf("%s x%d", id, dups[id]))
		}
	}
	if len(unexpected) > 0 {
		t.Errorf("%d events delivered more than once that the killed worker did not hold (only its unconfirmed batch may be delivered twice), e.g. %v",
			len(unexpected), unexpected[:min(10, len(unexpected))])
	}
	if ordered {
		v := orderViolations(planned, r.firstArrivals())
		if len(v) > 0 {
			t.Errorf("%d events first arrived before an earlier event of their aggregate:\n%s", len(v), strings.Join(v[:min(10, len(v))], "\n"))
		}
	}
	distinct, total, _ := r.snapshot()
	t.Logf("ordering=%s: %d events, %d deliveries (%d duplicates of %d stranded)", ordering, distinct, total, total-distinct, len(stranded))
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

// shareScenario: workers relay a backlog of n with ordering on (the
// default); partitions divide the work, so no event is claimed twice, not
// even on FerretDB, and every worker publishes a share.
//
// On FerretDB the backlog is written before the workers start and lasts
// long after their partitions have settled. MongoDB relays it in moments,
// before ownership could settle, so there the workers start first and the
// backlog arrives as a stream, insertChunk every sharePace.
func shareScenario(t *testing.T, s stack, workers, n int) {
	const sharePace = 250 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(n))
	defer cancel()
	db := s.database(t)
	coll := db.Collection(mongo.CollectionDefault)
	exchange := testenv.UniqueName(t, "ex_")
	r := consume(t, s, exchange)

	var ids []string
	if !s.atomicClaims {
		ids = insertBacklog(ctx, t, coll, n, "e2e.shared")
	}
	procs := make([]*workerProc, workers)
	for i := range procs {
		id := fmt.Sprintf("%s-w%d", db.Name(), i)
		procs[i] = startWorker(t, id, s.workerEnv(db.Name(), exchange, id))
	}
	if s.atomicClaims {
		tick := time.NewTicker(sharePace)
		for len(ids) < n {
			ids = append(ids, insertBacklog(ctx, t, coll, min(insertChunk, n-len(ids)), "e2e.shared")...)
			select {
			case <-ctx.Done():
				t.Fatalf("inserting the stream: %v", ctx.Err())
			case <-tick.C:
			}
		}
		tick.Stop()
	}
	if err := r.waitDistinct(ctx, n); err != nil {
		t.Fatalf("%v; documents by status: %v", err, statusCounts(t, coll))
	}
	waitCount(ctx, t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}}, int64(n))
	stopWorkers(t, procs...)
	r.drain(t)

	r.checkExactly(t, ids)
	distinct, total, _ := r.snapshot()
	if dups := total - distinct; dups != 0 {
		t.Errorf("%d duplicate deliveries of %d events, want none: replicas that own disjoint partitions never claim the same event", dups, n)
	}
	// Each PUBLISHED document keeps the id of the worker that marked it.
	for _, p := range procs {
		c, err := coll.CountDocuments(ctx, bson.D{
			{Key: events.FieldStatus, Value: events.StatusPublished},
			{Key: events.FieldWorkerID, Value: p.name},
		})
		if err != nil {
			t.Fatalf("count events published by %s: %v", p.name, err)
		}
		t.Logf("%s published %d of %d events", p.name, c, n)
		if share := int64(n / (workers * 10)); c < share {
			t.Errorf("%s published %d of %d events, want at least %d (a tenth of an even share)", p.name, c, n, share)
		}
	}
}

// ---------------------------------------------------------------------------
// The ordered consumer
// ---------------------------------------------------------------------------

// orderReceiver is one consumer of one queue, whose delivery order is the
// order the queue holds: it notes each message id's first position.
type orderReceiver struct {
	*receiver
	queue, exchange string
	ctl             *amqp.Channel // declares and binds; deliveries use another

	mu    sync.Mutex
	seq   int
	first map[string]int
	log   []string // message ids in order of first arrival
}

// consumeOrdered declares exchange as the worker does, an exclusive queue
// bound to it with keys, and consumes the queue with one consumer. Call it
// before starting workers.
func consumeOrdered(t *testing.T, s stack, exchange string, keys ...string) *orderReceiver {
	t.Helper()
	conn, err := amqp.Dial(s.amqpURL)
	if err != nil {
		t.Fatalf("dial RabbitMQ: %v", err)
	}
	r := &orderReceiver{receiver: &receiver{counts: map[string]int{}}, exchange: exchange, first: map[string]int{}}
	done := make(chan struct{})
	started := false
	// Cleanups run last-registered first: workers (started after this)
	// stop before the queue and exchange go.
	t.Cleanup(func() {
		if r.ctl != nil && r.queue != "" {
			if _, err := r.ctl.QueueDelete(r.queue, false, false, false); err == nil {
				_ = r.ctl.ExchangeDelete(exchange, true, false)
			}
		}
		_ = conn.Close()
		if started {
			<-done
		}
	})
	if r.ctl, err = conn.Channel(); err != nil {
		t.Fatalf("open AMQP channel: %v", err)
	}
	if err := r.ctl.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatalf("declare exchange %q: %v", exchange, err)
	}
	q, err := r.ctl.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatalf("declare queue: %v", err)
	}
	r.queue = q.Name
	for _, k := range keys {
		r.bind(t, k)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open AMQP channel: %v", err)
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatalf("consume queue %q: %v", q.Name, err)
	}
	started = true
	go func() {
		defer close(done)
		for d := range deliveries {
			r.receiver.add(d)
			r.note(d.MessageId)
		}
	}()
	return r
}

// bind binds the queue to the exchange with key.
func (r *orderReceiver) bind(t *testing.T, key string) {
	t.Helper()
	if err := r.ctl.QueueBind(r.queue, key, r.exchange, false, nil); err != nil {
		t.Fatalf("bind queue %q to %q with %q: %v", r.queue, r.exchange, key, err)
	}
}

func (r *orderReceiver) note(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, seen := r.first[id]; !seen {
		r.first[id] = r.seq
		r.log = append(r.log, id)
	}
	r.seq++
}

// arrived returns the message ids received so far.
func (r *orderReceiver) arrived() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}

// arrivedOf returns those of ids that have arrived.
func (r *orderReceiver) arrivedOf(ids []string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, id := range ids {
		if _, ok := r.first[id]; ok {
			out = append(out, id)
		}
	}
	return out
}

// firstArrivals maps each message id to the position of its first
// delivery among all deliveries.
func (r *orderReceiver) firstArrivals() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.first))
	for k, v := range r.first {
		out[k] = v
	}
	return out
}

// duplicates returns the ids delivered more than once, with their counts.
func (r *orderReceiver) duplicates() map[string]int {
	r.receiver.mu.Lock()
	defer r.receiver.mu.Unlock()
	out := map[string]int{}
	for id, c := range r.counts {
		if c > 1 {
			out[id] = c
		}
	}
	return out
}
