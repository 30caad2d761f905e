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
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/internal/workerproc"
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
	runOrderingScenarios(t, localStack(t))
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
	share := e2eEvents(t)
	if s.atomicClaims {
		share = max(share, mongoMidBacklog)
	}
	runParallel(t, []subtest{
		{"aggregate", func(t *testing.T) { orderingScenario(t, s, plan, "aggregate") }},
		{"none", func(t *testing.T) { orderingScenario(t, s, plan, "none") }},
		{"share", func(t *testing.T) { shareScenario(t, s, 3, share) }},
	})
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

	procs := make([]*workerproc.Proc, 3)
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
	explained(t, coll, func() { r.waitDistinct(ctx, t, len(planned)/8) })
	stranded := killHolding(ctx, t, coll, r.receiver, victim, victim.Name(), len(planned))
	t.Logf("killed %s holding %d events; %d of %d events received", victim.Name(), len(stranded), r.distinct(), len(planned))

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
	explained(t, coll, func() { r.waitIDs(ctx, t, rest) })
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
	explained(t, coll, func() { r.waitIDs(ctx, t, append(slices.Clone(behindPoison), requeuedPoison)) })
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
		isStranded[testenv.MessageID(id)] = true
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
	distinct, total, _ := r.Snapshot()
	t.Logf("ordering=%s: %d events, %d deliveries (%d duplicates of %d stranded)", ordering, distinct, total, total-distinct, len(stranded))
}
