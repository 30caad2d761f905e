package main

// The guarantees of one outbox, held by each outbox of a fleet of three
// relayed by three replicas: retention, pause, and FAILED with requeue.
// Each acts on one outbox, or sets it apart, and checks that the others
// are left as they were.

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
)

const (
	// fleetGuaranteeEvents is the NEW events of each outbox: enough to
	// take several claims of each replica, few enough for a minute.
	fleetGuaranteeEvents = 300
	// fleetGuaranteeReplicas is the worker processes of each scenario.
	fleetGuaranteeReplicas = 3
	// fleetGuaranteeTimeout bounds a scenario: generous, for the host is
	// shared and FerretDB is slow; nothing is timed within it. Retention
	// runs each minute, but a replica whose claims are slow leaves runs
	// out for up to schedule.YieldMaxDefault (10 minutes): on a busy
	// host the first run that deletes may come that late.
	fleetGuaranteeTimeout = 15 * time.Minute
)

// fleetGuaranteeEnv is the replicas' settings over workerEnv's, with
// more set over them: the stale threshold at a minute, as relayEnv's,
// for these scenarios test no recovery, and a threshold of 15 s on a
// busy host has replicas take back claims that are only slow.
func fleetGuaranteeEnv(more map[string]string) map[string]string {
	env := map[string]string{"OUTBOX_STALE_AFTER": "1m"}
	maps.Copy(env, more)
	return env
}

// threeOutboxes is a fleet of a, b and c, two in one database and one in
// another, each with the fields of its entry given by fields (by name),
// written to a fleet file whose path it returns with the database the
// workers are named after.
func threeOutboxes(t *testing.T, s stack, fields map[string]map[string]string) ([]*fleetOutbox, string, string) {
	t.Helper()
	client := s.connect(t, testenv.ClientMaxPoolSize)
	shared, other := uniqueDatabase(t, client), uniqueDatabase(t, client)
	outboxes := []*fleetOutbox{
		{name: "a", db: shared, collection: "a_outbox", fields: fields["a"]},
		{name: "b", db: shared, collection: "b_outbox", fields: fields["b"]},
		{name: "c", db: other, collection: "events", fields: fields["c"]},
	}
	return outboxes, fleetOf(t, s, outboxes), shared.Name()
}

// insertKind inserts n events of type typ into o, named <o>-<kind>-<i>,
// createdAt a millisecond apart from base, each with fields set over a
// NEW event's, and returns their ids. Each kind has aggregates of its
// own: a held kind (paused, FAILED) holds none of another's.
func (o *fleetOutbox) insertKind(ctx context.Context, t *testing.T, kind, typ string, n int, base time.Time, fields ...bson.E) []string {
	t.Helper()
	ids := make([]string, n)
	docs := make([]any, n)
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%s-%d", o.name, kind, i)
		docs[i] = draftDoc(t, events.Draft{
			ID: ids[i], Type: typ, AggregateType: "e2e", AggregateID: fmt.Sprintf("%s-%s-%02d", o.name, kind, i%fleetAggregates),
			Payload: bson.D{{Key: "outbox", Value: o.name}, {Key: "n", Value: i}},
		}, base.Add(time.Duration(i)*time.Millisecond), fields...)
	}
	for i := 0; i < n; i += insertChunk {
		if _, err := o.coll.InsertMany(ctx, docs[i:min(i+insertChunk, n)], options.InsertMany().SetOrdered(false)); err != nil {
			t.Fatalf("insert %s events of %s: %v", kind, o.name, err)
		}
	}
	return ids
}

// countIDs counts those of ids that coll holds with status.
func countIDs(ctx context.Context, t *testing.T, coll *driver.Collection, status events.Status, ids []string) int64 {
	t.Helper()
	n, err := coll.CountDocuments(ctx, bson.D{{Key: events.FieldStatus, Value: status}, {Key: events.FieldID, Value: bson.D{{Key: "$in", Value: ids}}}})
	if err != nil {
		t.Fatalf("count %s events: %v", status, err)
	}
	return n
}

// countAll counts those of ids that coll holds, whatever their status.
func countAll(ctx context.Context, t *testing.T, coll *driver.Collection, ids []string) int64 {
	t.Helper()
	n, err := coll.CountDocuments(ctx, bson.D{{Key: events.FieldID, Value: bson.D{{Key: "$in", Value: ids}}}})
	if err != nil {
		t.Fatalf("count events: %v", err)
	}
	return n
}

// published is the fields of an event published at at.
func published(at time.Time) []bson.E {
	return []bson.E{{Key: events.FieldStatus, Value: events.StatusPublished}, {Key: events.FieldPublishedAt, Value: at}, {Key: events.FieldAttempts, Value: 1}}
}

// TestE2EFleetRetention: each outbox deletes its own PUBLISHED events
// past its own retention. a keeps 20 minutes, b an hour, c keeps
// everything (0); each holds events published 90 and 40 minutes ago and
// NEW events that the replicas relay meanwhile. a deletes both old sets,
// b only the 90-minute one, c neither; every event relayed now is kept.
func TestE2EFleetRetention(t *testing.T) {
	t.Parallel()
	s := localStack(t)
	ctx, cancel := context.WithTimeout(t.Context(), fleetGuaranteeTimeout)
	defer cancel()
	outboxes, path, db := threeOutboxes(t, s, map[string]map[string]string{
		"a": {"retention": "20m"}, "b": {"retention": "1h"}, "c": {"retention": "0"},
	})
	now := time.Now().UTC().Truncate(time.Millisecond)
	old, mid := map[string][]string{}, map[string][]string{}
	for _, o := range outboxes {
		old[o.name] = o.insertKind(ctx, t, "old", "fleet."+o.name, 100, now.Add(-2*time.Hour), published(now.Add(-90*time.Minute))...)
		mid[o.name] = o.insertKind(ctx, t, "mid", "fleet."+o.name, 100, now.Add(-2*time.Hour), published(now.Add(-40*time.Minute))...)
		o.ids = o.insertKind(ctx, t, "new", "fleet."+o.name, fleetGuaranteeEvents, now.Add(-time.Hour))
	}
	// The worker's own retention, which no outbox keeps, would delete
	// everything inserted here.
	procs, _ := startFleet(t, s, path, db, fleetGuaranteeReplicas, fleetGuaranteeEnv(map[string]string{"OUTBOX_RETENTION": "1m"}))

	a, b, c := outboxes[0], outboxes[1], outboxes[2]
	// Retention runs each minute (retention.ScheduleDefault): wait for
	// what each outbox must delete, then check that nothing else went.
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		left := countAll(ctx, t, a.coll, append(old["a"], mid["a"]...)) + countAll(ctx, t, b.coll, old["b"])
		return left == 0, fmt.Sprintf("%d events past retention in a and b not yet deleted", left)
	})
	for _, o := range outboxes {
		o.r.waitDistinct(ctx, t, fleetGuaranteeEvents)
	}
	stopWorkers(t, procs...)
	for _, check := range []struct {
		o    *fleetOutbox
		ids  []string
		what string
	}{
		{b, mid["b"], "published 40 minutes ago, within its retention of 1h"},
		{c, append(old["c"], mid["c"]...), "published 90 and 40 minutes ago, with retention 0 (kept forever)"},
		{a, a.ids, "relayed during the test"}, {b, b.ids, "relayed during the test"}, {c, c.ids, "relayed during the test"},
	} {
		if got := countIDs(ctx, t, check.o.coll, events.StatusPublished, check.ids); got != int64(len(check.ids)) {
			t.Errorf("outbox %s: %d of its %d events %s left PUBLISHED, want all", check.o.name, got, len(check.ids), check.what)
		}
	}
	for _, o := range outboxes {
		o.r.drain(t)
		o.r.checkExactly(t, o.ids)
	}
}

// fleetTool runs an operator command of the worker on the fleet file at
// path, and returns what it printed.
func fleetTool(ctx context.Context, t *testing.T, s stack, path string, args ...string) string {
	t.Helper()
	env := map[string]string{"OUTBOX_MONGO_URI": s.mongoURI, "OUTBOX_FLEET_FILE": path}
	return runTool(ctx, t, env, 0, args...)
}

// TestE2EFleetPause: a type paused in outbox a (worker pause --outbox a)
// is held there alone. Every outbox has events of that type and of its
// own, interleaved; b and c relay all of theirs, a relays its own type
// past the held ones, and a's events of the paused type stay NEW until
// the type is resumed in a, then arrive.
func TestE2EFleetPause(t *testing.T) {
	t.Parallel()
	s := localStack(t)
	ctx, cancel := context.WithTimeout(t.Context(), fleetGuaranteeTimeout)
	defer cancel()
	outboxes, path, db := threeOutboxes(t, s, nil)
	const typ = "fleet.shared"
	out := fleetTool(ctx, t, s, path, "pause", "--outbox", "a", "--type", typ, "--by", "e2e", "--reason", "held in a alone")
	if !strings.Contains(out, typ) {
		t.Errorf("worker pause printed %q, want it to name the type", out)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	pausedIDs, ownIDs := map[string][]string{}, map[string][]string{}
	for _, o := range outboxes {
		// The same createdAt for both kinds: the held events are among
		// the oldest of every claim of a.
		pausedIDs[o.name] = o.insertKind(ctx, t, "shared", typ, fleetGuaranteeEvents/2, now.Add(-time.Hour))
		ownIDs[o.name] = o.insertKind(ctx, t, "own", "fleet."+o.name, fleetGuaranteeEvents/2, now.Add(-time.Hour))
		o.ids = append(append([]string{}, pausedIDs[o.name]...), ownIDs[o.name]...)
	}
	procs, _ := startFleet(t, s, path, db, fleetGuaranteeReplicas, fleetGuaranteeEnv(nil))

	a := outboxes[0]
	for _, o := range outboxes[1:] {
		o.r.waitIDs(ctx, t, o.ids)
	}
	a.r.waitIDs(ctx, t, ownIDs["a"])
	if got := a.r.arrivedOf(pausedIDs["a"]); len(got) > 0 {
		t.Errorf("%d events of the type paused in a arrived (e.g. %s), want none until it is resumed", len(got), got[0])
	}
	if got := countIDs(ctx, t, a.coll, events.StatusNew, pausedIDs["a"]); got != int64(len(pausedIDs["a"])) {
		t.Errorf("outbox a: %d of its %d events of the paused type are NEW, want all", got, len(pausedIDs["a"]))
	}

	fleetTool(ctx, t, s, path, "resume", "--outbox", "a", "--type", typ, "--by", "e2e", "--reason", "done")
	a.r.waitIDs(ctx, t, pausedIDs["a"])
	stopWorkers(t, procs...)
	for _, o := range outboxes {
		o.r.drain(t)
		o.r.checkExactly(t, o.ids)
	}
}

// TestE2EFleetRequeue: every outbox holds FAILED events beside NEW ones;
// worker requeue --outbox b --all requeues b's alone, which the replicas
// then relay, while a's and c's stay FAILED and never arrive.
func TestE2EFleetRequeue(t *testing.T) {
	t.Parallel()
	s := localStack(t)
	ctx, cancel := context.WithTimeout(t.Context(), fleetGuaranteeTimeout)
	defer cancel()
	outboxes, path, db := threeOutboxes(t, s, nil)
	now := time.Now().UTC().Truncate(time.Millisecond)
	failedIDs := map[string][]string{}
	failed := []bson.E{
		{Key: events.FieldStatus, Value: events.StatusFailed}, {Key: events.FieldAttempts, Value: 10},
		{Key: events.FieldFailedAt, Value: now.Add(-time.Hour)}, {Key: events.FieldLastError, Value: "broker refused (inserted FAILED by the test)"},
	}
	for _, o := range outboxes {
		failedIDs[o.name] = o.insertKind(ctx, t, "failed", "fleet."+o.name, 50, now.Add(-2*time.Hour), failed...)
		o.ids = o.insertKind(ctx, t, "new", "fleet."+o.name, fleetGuaranteeEvents, now.Add(-time.Hour))
	}
	procs, _ := startFleet(t, s, path, db, fleetGuaranteeReplicas, fleetGuaranteeEnv(nil))
	for _, o := range outboxes {
		o.r.waitIDs(ctx, t, o.ids)
	}

	out := fleetTool(ctx, t, s, path, "requeue", "--outbox", "b", "--all", "--yes", "--by", "e2e", "--reason", "broker fixed")
	if want := fmt.Sprintf("requeued %d FAILED events to NEW", len(failedIDs["b"])); !strings.HasPrefix(out, want) {
		t.Errorf("worker requeue --outbox b printed %q, want %q", out, want)
	}
	b := outboxes[1]
	b.r.waitIDs(ctx, t, failedIDs["b"])
	stopWorkers(t, procs...)
	for _, o := range []*fleetOutbox{outboxes[0], outboxes[2]} {
		if got := o.r.arrivedOf(failedIDs[o.name]); len(got) > 0 {
			t.Errorf("outbox %s: %d of its FAILED events arrived (e.g. %s), want none: only b was requeued", o.name, len(got), got[0])
		}
		if got := countIDs(ctx, t, o.coll, events.StatusFailed, failedIDs[o.name]); got != int64(len(failedIDs[o.name])) {
			t.Errorf("outbox %s: %d of its %d FAILED events are still FAILED, want all", o.name, got, len(failedIDs[o.name]))
		}
	}
	b.ids = append(b.ids, failedIDs["b"]...)
	for _, o := range outboxes {
		o.r.drain(t)
		o.r.checkExactly(t, o.ids)
	}
}
