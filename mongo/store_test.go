package mongo_test

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/recovery"
	"github.com/outboxrelay/outbox/retention"
)

// The store is what every service's narrow interface asks for.
var (
	_ claim.Store     = (*mongo.Store)(nil)
	_ recovery.Store  = (*mongo.Store)(nil)
	_ retention.Store = (*mongo.Store)(nil)
	_ ops.StatsSource = (*mongo.Store)(nil)
)

// base is the tests' clock. BSON dates keep milliseconds, so every time
// written and compared is a whole millisecond.
var base = time.Date(2025, 3, 4, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) time.Time { return base.Add(-d) }

// setup returns a prepared store on a database of its own, and its collection.
func setup(t *testing.T) (*mongo.Store, *driver.Collection) {
	t.Helper()
	db := testenv.Database(t)
	s := mongo.New(db.Client(), mongo.Config{Database: db.Name(), Logger: slog.New(slog.DiscardHandler)})
	if err := s.Prepare(t.Context()); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	return s, s.Collection()
}

// ev returns an event document with the given status and createdAt,
// followed by any extra fields.
func ev(id any, status events.Status, createdAt time.Time, extra ...bson.E) bson.D {
	d := bson.D{
		{Key: events.FieldID, Value: id},
		{Key: events.FieldType, Value: "order.created"},
		{Key: events.FieldPayload, Value: bson.D{{Key: "n", Value: 1}}},
		{Key: events.FieldStatus, Value: status},
		{Key: events.FieldCreatedAt, Value: createdAt},
	}
	return append(d, extra...)
}

// withType sets the event type of d.
func withType(d bson.D, typ string) bson.D {
	for i := range d {
		if d[i].Key == events.FieldType {
			d[i].Value = typ
		}
	}
	return d
}

func field(key string, value any) bson.E { return bson.E{Key: key, Value: value} }

func insert(t *testing.T, coll *driver.Collection, docs ...bson.D) {
	t.Helper()
	if _, err := coll.InsertMany(t.Context(), docs); err != nil {
		t.Fatalf("insert %d events: %v", len(docs), err)
	}
}

func get(t *testing.T, coll *driver.Collection, id any) events.Event {
	t.Helper()
	var e events.Event
	if err := coll.FindOne(t.Context(), bson.D{{Key: events.FieldID, Value: id}}).Decode(&e); err != nil {
		t.Fatalf("find event %v: %v", id, err)
	}
	return e
}

// has reports whether the stored event id has the field key at all.
func has(t *testing.T, coll *driver.Collection, id any, key string) bool {
	t.Helper()
	raw, err := coll.FindOne(t.Context(), bson.D{{Key: events.FieldID, Value: id}}).Raw()
	if err != nil {
		t.Fatalf("find event %v: %v", id, err)
	}
	_, err = raw.LookupErr(key)
	return err == nil
}

// statuses returns the status of every event, by _id as a string.
func statuses(t *testing.T, coll *driver.Collection) map[string]events.Status {
	t.Helper()
	cur, err := coll.Find(t.Context(), bson.D{})
	if err != nil {
		t.Fatalf("find events: %v", err)
	}
	var all []events.Event
	if err := cur.All(t.Context(), &all); err != nil {
		t.Fatalf("read events: %v", err)
	}
	out := map[string]events.Status{}
	for _, e := range all {
		out[idString(e.ID)] = e.Status
	}
	return out
}

func idString(id any) string {
	if oid, ok := id.(bson.ObjectID); ok {
		return oid.Hex()
	}
	return fmt.Sprint(id)
}

func ids(claimed []events.Claimed) []string {
	out := make([]string, len(claimed))
	for i, c := range claimed {
		out[i] = idString(c.ID)
	}
	return out
}

func lease(worker string) events.Lease {
	return events.Lease{WorkerID: worker, Token: "token-" + worker, At: base}
}

func TestPrepare(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	s := mongo.New(db.Client(), mongo.Config{Database: db.Name(), Collection: "outbox_events"})
	if s.SupportsTransactions() {
		t.Error("SupportsTransactions before Prepare = true, want false (not known yet)")
	}
	for i := range 3 { // every replica prepares at start: it must be idempotent
		if err := s.Prepare(t.Context()); err != nil {
			t.Fatalf("Prepare #%d: %v", i+1, err)
		}
	}
	if got := s.Collection().Name(); got != "outbox_events" {
		t.Errorf("Collection().Name() = %q, want outbox_events", got)
	}

	cur, err := s.Collection().Indexes().List(t.Context())
	if err != nil {
		t.Fatalf("list indexes: %v", err)
	}
	var specs []struct {
		Name string `bson:"name"`
		Key  bson.D `bson:"key"`
	}
	if err := cur.All(t.Context(), &specs); err != nil {
		t.Fatalf("read indexes: %v", err)
	}
	got := map[string]string{}
	for _, spec := range specs {
		var keys []string
		for _, k := range spec.Key {
			keys = append(keys, fmt.Sprintf("%s:%v", k.Key, k.Value))
		}
		got[spec.Name] = strings.Join(keys, ",")
	}
	want := map[string]string{
		"_id_":               "_id:1",
		"outbox_claim":       "status:1,createdAt:1",
		"outbox_claim_retry": "status:1,retryAt:1,createdAt:1",
		"outbox_claim_order": "status:1,retryAt:1,createdAt:1,_id:1",
		"outbox_stale":       "status:1,processingAt:1",
		"outbox_retention":   "status:1,publishedAt:1",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("indexes after three Prepares (-want +got):\n%s", diff)
	}

	want2 := false
	if !testenv.IsFerretDB() {
		// A real server: transactions exactly when it is a replica set
		// member or a mongos.
		var hello struct {
			SetName string `bson:"setName"`
			Msg     string `bson:"msg"`
		}
		if err := db.Client().Database("admin").RunCommand(t.Context(), bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
			t.Fatalf("hello: %v", err)
		}
		want2 = hello.SetName != "" || hello.Msg == "isdbgrid"
	}
	if got := s.SupportsTransactions(); got != want2 {
		t.Errorf("SupportsTransactions = %t, want %t (FerretDB: %t)", got, want2, testenv.IsFerretDB())
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

// TestClaim runs with both of the claim's find strategies: the split one
// MongoDB uses and the single find FerretDB uses must claim the same events.
func TestClaim(t *testing.T) {
	t.Parallel()
	for _, split := range []bool{false, true} {
		t.Run(fmt.Sprintf("split=%t", split), func(t *testing.T) {
			t.Parallel()
			testClaim(t, split)
		})
	}
}

func testClaim(t *testing.T, split bool) {
	s, coll := setup(t)
	mongo.SetSplitClaim(s, split)
	oid := bson.NewObjectID()
	insert(t, coll,
		// Inserted out of order: the claim sorts by createdAt.
		ev("new-3", events.StatusNew, ago(3*time.Minute)),
		ev(oid, events.StatusNew, ago(5*time.Minute)),
		ev("new-1", events.StatusNew, ago(1*time.Minute), field(events.FieldAttempts, 2)),
		ev("new-4", events.StatusNew, ago(4*time.Minute)),
		// Older than every NEW event, but not claimable.
		ev("published", events.StatusPublished, ago(time.Hour), field(events.FieldPublishedAt, ago(time.Hour))),
		ev("failed", events.StatusFailed, ago(time.Hour)),
		ev("processing", events.StatusProcessing, ago(time.Hour),
			field(events.FieldWorkerID, "other"), field(events.FieldClaimToken, "other-token"),
			field(events.FieldProcessingAt, ago(time.Second)), field(events.FieldAttempts, 1)),
		// Waiting for a retry: the oldest of all, skipped until its time.
		ev("retry-later", events.StatusNew, ago(2*time.Hour), field(events.FieldRetryAt, base.Add(time.Second)), field(events.FieldAttempts, 1)),
		// Its retry time has passed: claimable, in createdAt order.
		ev("retry-due", events.StatusNew, ago(2*time.Minute), field(events.FieldRetryAt, ago(time.Millisecond)), field(events.FieldAttempts, 1)),
	)

	a := lease("a")
	got, full, err := claimN(t.Context(), s, a, 3)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if !full {
		t.Error("first claim of 3 with 5 claimable: full = false, want true")
	}
	if diff := cmp.Diff([]string{oid.Hex(), "new-4", "new-3"}, ids(got)); diff != "" {
		t.Errorf("first claim of 3: ids (-want +got):\n%s", diff)
	}
	for _, c := range got {
		if c.Attempts != 1 {
			t.Errorf("claimed %v: Attempts = %d, want 1", c.ID, c.Attempts)
		}
		if typ := c.Doc.Lookup(events.FieldType).StringValue(); typ != "order.created" {
			t.Errorf("claimed %v: Doc type = %q, want the stored document", c.ID, typ)
		}
	}

	b := lease("b")
	got, full, err = claimN(t.Context(), s, b, 10)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if full {
		t.Error("second claim of 10 with 2 claimable: full = true, want false")
	}
	if diff := cmp.Diff([]string{"retry-due", "new-1"}, ids(got)); diff != "" {
		t.Errorf("second claim of 10: ids (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{2, 3}, []int{got[0].Attempts, got[1].Attempts}); diff != "" {
		t.Errorf("second claim: attempts (-want +got):\n%s", diff)
	}

	got, _, err = claimN(t.Context(), s, lease("c"), 10)
	if err != nil || len(got) != 0 {
		t.Errorf("third claim = %v, %v; want nothing left to claim", ids(got), err)
	}
	// At the retry time, the waiting event is claimable.
	later := lease("d")
	later.At = base.Add(time.Second)
	got, _, err = claimN(t.Context(), s, later, 10)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if diff := cmp.Diff([]string{"retry-later"}, ids(got)); diff != "" {
		t.Errorf("claim at the retry time: ids (-want +got):\n%s", diff)
	}

	// What the claims wrote.
	for _, tt := range []struct {
		id       any
		lease    events.Lease
		attempts int
	}{{oid, a, 1}, {"new-3", a, 1}, {"new-1", b, 3}, {"retry-due", b, 2}, {"retry-later", later, 2}} {
		e := get(t, coll, tt.id)
		want := events.Event{Status: events.StatusProcessing, WorkerID: tt.lease.WorkerID,
			ClaimToken: tt.lease.Token, ProcessingAt: tt.lease.At, Attempts: tt.attempts}
		gotE := events.Event{Status: e.Status, WorkerID: e.WorkerID, ClaimToken: e.ClaimToken,
			ProcessingAt: e.ProcessingAt, Attempts: e.Attempts, RetryAt: e.RetryAt}
		if diff := cmp.Diff(want, gotE); diff != "" {
			t.Errorf("event %v after claim (-want +got):\n%s", tt.id, diff)
		}
	}
	// What no claim may touch.
	if e := get(t, coll, "processing"); e.WorkerID != "other" || e.ClaimToken != "other-token" || e.Attempts != 1 {
		t.Errorf("another worker's PROCESSING event changed: %+v", e)
	}
	if diff := cmp.Diff(map[string]events.Status{
		oid.Hex(): events.StatusProcessing, "new-1": events.StatusProcessing, "new-3": events.StatusProcessing,
		"new-4": events.StatusProcessing, "retry-due": events.StatusProcessing, "retry-later": events.StatusProcessing,
		"published": events.StatusPublished, "failed": events.StatusFailed, "processing": events.StatusProcessing,
	}, statuses(t, coll)); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
}

func TestClaimEmpty(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	got, _, err := claimN(t.Context(), s, lease("a"), 10)
	if err != nil || len(got) != 0 {
		t.Errorf("Claim on an empty outbox = %v, %v; want nothing, nil", got, err)
	}
}

// claimAll inserts n NEW events and claims them for l.
func claimAll(t *testing.T, s *mongo.Store, coll *driver.Collection, l events.Lease, names ...string) {
	t.Helper()
	var docs []bson.D
	for i, name := range names {
		docs = append(docs, ev(name, events.StatusNew, ago(time.Duration(len(names)-i)*time.Second)))
	}
	insert(t, coll, docs...)
	got, _, err := claimN(t.Context(), s, l, len(names))
	if err != nil || len(got) != len(names) {
		t.Fatalf("Claim = %v, %v; want all of %v", ids(got), err, names)
	}
}

func TestMarkPublished(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	a := lease("a")
	claimAll(t, s, coll, a, "e1", "e2", "e3")

	at := base.Add(time.Second)
	n, err := s.MarkPublished(t.Context(), a, []any{"e1", "e2"}, at)
	if err != nil || n != 2 {
		t.Fatalf("MarkPublished(e1, e2) = %d, %v; want 2, nil", n, err)
	}
	for _, id := range []string{"e1", "e2"} {
		if e := get(t, coll, id); e.Status != events.StatusPublished || !e.PublishedAt.Equal(at) {
			t.Errorf("%s: status %s publishedAt %s, want PUBLISHED at %s", id, e.Status, e.PublishedAt, at)
		}
	}
	if e := get(t, coll, "e3"); e.Status != events.StatusProcessing || has(t, coll, "e3", events.FieldPublishedAt) {
		t.Errorf("e3 (not in the call): status %s, publishedAt %s; want PROCESSING without publishedAt", e.Status, e.PublishedAt)
	}
	// Marking again changes nothing: they are no longer PROCESSING.
	if n, err := s.MarkPublished(t.Context(), a, []any{"e1"}, at); err != nil || n != 0 {
		t.Errorf("MarkPublished of a PUBLISHED event = %d, %v; want 0, nil", n, err)
	}
	if n, err := s.MarkPublished(t.Context(), a, nil, at); err != nil || n != 0 {
		t.Errorf("MarkPublished(no ids) = %d, %v; want 0, nil", n, err)
	}
}

func TestRelease(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	a := lease("a")
	claimAll(t, s, coll, a, "retry", "refund", "fail", "keep")
	retryAt := base.Add(4 * time.Second)

	for _, r := range []events.Release{
		{IDs: []any{"retry"}, Status: events.StatusNew, LastError: "nacked", RetryAt: retryAt},
		{IDs: []any{"refund"}, Status: events.StatusNew, LastError: "broker down", Refund: true},
		{IDs: []any{"fail"}, Status: events.StatusFailed, LastError: "gave up"},
	} {
		if n, err := s.Release(t.Context(), a, r); err != nil || n != 1 {
			t.Fatalf("Release(%v to %s) = %d, %v; want 1, nil", r.IDs, r.Status, n, err)
		}
	}

	type view struct {
		Status                              events.Status
		Attempts                            int
		LastError                           string
		RetryAt, FailedAt                   time.Time
		WorkerID, Token, ProcessingAt, Left bool // fields still present
	}
	look := func(id string) view {
		e := get(t, coll, id)
		return view{
			Status: e.Status, Attempts: e.Attempts, LastError: e.LastError, RetryAt: e.RetryAt, FailedAt: e.FailedAt,
			WorkerID: has(t, coll, id, events.FieldWorkerID), Token: has(t, coll, id, events.FieldClaimToken),
			ProcessingAt: has(t, coll, id, events.FieldProcessingAt),
		}
	}
	want := map[string]view{
		"retry":  {Status: events.StatusNew, Attempts: 1, LastError: "nacked", RetryAt: retryAt},
		"refund": {Status: events.StatusNew, Attempts: 0, LastError: "broker down"},
		// FAILED keeps who had it last, for the operator; the token goes.
		"fail": {Status: events.StatusFailed, Attempts: 1, LastError: "gave up", FailedAt: a.At, WorkerID: true, ProcessingAt: true},
		"keep": {Status: events.StatusProcessing, Attempts: 1, WorkerID: true, Token: true, ProcessingAt: true},
	}
	got := map[string]view{}
	for id := range want {
		got[id] = look(id)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events after release (-want +got):\n%s", diff)
	}

	if n, err := s.Release(t.Context(), a, events.Release{IDs: []any{"keep"}, Status: events.StatusPublished}); err == nil || n != 0 {
		t.Errorf("Release to PUBLISHED = %d, %v; want 0 and an error", n, err)
	}
	if e := get(t, coll, "keep"); e.Status != events.StatusProcessing {
		t.Errorf("a refused release changed keep to %s", e.Status)
	}
	if n, err := s.Release(t.Context(), a, events.Release{Status: events.StatusNew}); err != nil || n != 0 {
		t.Errorf("Release(no ids) = %d, %v; want 0, nil", n, err)
	}
}

func TestRecoverStale(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	claimedBy := func(at time.Time, attempts int) []bson.E {
		return []bson.E{
			field(events.FieldWorkerID, "dead-worker"), field(events.FieldClaimToken, "tok"),
			field(events.FieldProcessingAt, at), field(events.FieldAttempts, attempts),
		}
	}
	staleBefore := ago(time.Minute)
	insert(t, coll,
		ev("stale", events.StatusProcessing, ago(time.Hour), claimedBy(ago(2*time.Minute), 1)...),
		ev("stale-last", events.StatusProcessing, ago(time.Hour), claimedBy(ago(2*time.Minute), 3)...),
		ev("stale-over", events.StatusProcessing, ago(time.Hour), claimedBy(ago(2*time.Minute), 4)...),
		ev("fresh", events.StatusProcessing, ago(time.Hour), claimedBy(ago(59*time.Second), 3)...),
		// PUBLISHED keeps its old processingAt: recovery must leave it be.
		ev("published", events.StatusPublished, ago(time.Hour),
			append(claimedBy(ago(time.Hour), 1), field(events.FieldPublishedAt, ago(time.Hour)))...),
		ev("new", events.StatusNew, ago(time.Hour)),
	)

	reset, failed, err := s.RecoverStale(t.Context(), staleBefore, base, 3)
	if err != nil {
		t.Fatalf("RecoverStale: %v", err)
	}
	if reset != 1 || failed != 2 {
		t.Errorf("RecoverStale = reset %d, failed %d; want 1, 2", reset, failed)
	}

	e := get(t, coll, "stale")
	if e.Status != events.StatusNew || e.Attempts != 1 || !strings.Contains(e.LastError, "stale") {
		t.Errorf("stale: status %s attempts %d lastError %q; want NEW, 1, a reason saying stale", e.Status, e.Attempts, e.LastError)
	}
	for _, f := range []string{events.FieldWorkerID, events.FieldProcessingAt, events.FieldClaimToken} {
		if has(t, coll, "stale", f) {
			t.Errorf("stale: %s still set after the reset", f)
		}
	}
	for _, id := range []string{"stale-last", "stale-over"} {
		e := get(t, coll, id)
		if e.Status != events.StatusFailed || !e.FailedAt.Equal(base) || !strings.Contains(e.LastError, "last attempt") {
			t.Errorf("%s: status %s failedAt %s lastError %q; want FAILED at %s with a reason", id, e.Status, e.FailedAt, e.LastError, base)
		}
		if has(t, coll, id, events.FieldClaimToken) {
			t.Errorf("%s: claimToken still set: the dead worker's late write could still land", id)
		}
	}
	if diff := cmp.Diff(map[string]events.Status{
		"stale": events.StatusNew, "stale-last": events.StatusFailed, "stale-over": events.StatusFailed,
		"fresh": events.StatusProcessing, "published": events.StatusPublished, "new": events.StatusNew,
	}, statuses(t, coll)); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if e := get(t, coll, "fresh"); e.WorkerID != "dead-worker" || e.ClaimToken != "tok" {
		t.Errorf("fresh claim changed: %+v", e)
	}

	// Nothing stale is left; a second run (another replica) changes nothing.
	if reset, failed, err := s.RecoverStale(t.Context(), staleBefore, base, 3); err != nil || reset != 0 || failed != 0 {
		t.Errorf("second RecoverStale = %d, %d, %v; want 0, 0, nil", reset, failed, err)
	}
	// maxAttempts 0 means no limit: the fresh one, once stale, goes back to
	// NEW whatever its attempts.
	if reset, failed, err := s.RecoverStale(t.Context(), base, base, 0); err != nil || reset != 1 || failed != 0 {
		t.Errorf("RecoverStale without a limit = %d, %d, %v; want 1, 0, nil", reset, failed, err)
	}
	if e := get(t, coll, "fresh"); e.Status != events.StatusNew {
		t.Errorf("fresh after it went stale with no limit: %s, want NEW", e.Status)
	}
}

func TestDeletePublished(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	cutoff := ago(24 * time.Hour)
	var docs []bson.D
	for i := range 5 {
		docs = append(docs, ev(fmt.Sprintf("old-%d", i), events.StatusPublished, ago(48*time.Hour),
			field(events.FieldPublishedAt, cutoff.Add(-time.Duration(i+1)*time.Minute))))
	}
	docs = append(docs,
		ev("at-cutoff", events.StatusPublished, ago(48*time.Hour), field(events.FieldPublishedAt, cutoff)),
		ev("recent", events.StatusPublished, ago(48*time.Hour), field(events.FieldPublishedAt, ago(time.Hour))),
		// FAILED is never deleted, even one that somehow carries an old publishedAt.
		ev("failed", events.StatusFailed, ago(48*time.Hour),
			field(events.FieldFailedAt, ago(47*time.Hour)), field(events.FieldPublishedAt, ago(47*time.Hour))),
		ev("new", events.StatusNew, ago(48*time.Hour)),
		ev("processing", events.StatusProcessing, ago(48*time.Hour), field(events.FieldProcessingAt, ago(47*time.Hour))),
	)
	insert(t, coll, docs...)

	var got []int
	for range 3 {
		n, err := s.DeletePublished(t.Context(), cutoff, 3)
		if err != nil {
			t.Fatalf("DeletePublished: %v", err)
		}
		got = append(got, n)
	}
	if diff := cmp.Diff([]int{3, 2, 0}, got); diff != "" {
		t.Errorf("deleted per call with limit 3 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]events.Status{
		"at-cutoff": events.StatusPublished, "recent": events.StatusPublished, "failed": events.StatusFailed,
		"new": events.StatusNew, "processing": events.StatusProcessing,
	}, statuses(t, coll)); diff != "" {
		t.Errorf("events left (-want +got):\n%s", diff)
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)

	st, err := s.Stats(t.Context(), base)
	if err != nil {
		t.Fatalf("Stats on an empty outbox: %v", err)
	}
	want := events.Stats{Counts: map[events.Status]int64{
		events.StatusNew: 0, events.StatusProcessing: 0, events.StatusPublished: 0, events.StatusFailed: 0,
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

func TestRequeue(t *testing.T) {
	t.Parallel()
	oid := bson.NewObjectID()
	newOID := bson.NewObjectID()
	failed := func(id any, typ string) bson.D {
		d := ev(id, events.StatusFailed, ago(time.Hour),
			field(events.FieldAttempts, 10), field(events.FieldLastError, "gave up after 10 attempts"),
			field(events.FieldFailedAt, ago(time.Minute)), field(events.FieldRetryAt, ago(2*time.Minute)),
			field(events.FieldWorkerID, "w"), field(events.FieldProcessingAt, ago(3*time.Minute)))
		return withType(d, typ)
	}
	all := []string{oid.Hex(), "order-42", "x1", "x2", "y1"}
	tests := []struct {
		name    string
		filter  mongo.RequeueFilter
		dryRun  bool
		wantN   int
		wantNew []string // FAILED events that must be NEW afterwards
	}{
		{"by ObjectID hex", mongo.RequeueFilter{IDs: []string{oid.Hex()}}, false, 1, []string{oid.Hex()}},
		{"by string id", mongo.RequeueFilter{IDs: []string{"order-42"}}, false, 1, []string{"order-42"}},
		{"by several ids", mongo.RequeueFilter{IDs: []string{"order-42", oid.Hex(), "no-such"}}, false, 2, []string{oid.Hex(), "order-42"}},
		{"an id that is not FAILED", mongo.RequeueFilter{IDs: []string{newOID.Hex()}}, false, 0, nil},
		{"by type", mongo.RequeueFilter{Type: "x.happened"}, false, 2, []string{"x1", "x2"}},
		{"by id and type: both must match", mongo.RequeueFilter{IDs: []string{"x1", "y1"}, Type: "y.happened"}, false, 1, []string{"y1"}},
		{"all", mongo.RequeueFilter{All: true}, false, 5, all},
		{"dry run counts and changes nothing", mongo.RequeueFilter{All: true}, true, 5, nil},
		{"dry run by type", mongo.RequeueFilter{Type: "x.happened"}, true, 2, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, coll := setup(t)
			insert(t, coll,
				failed(oid, "order.created"), failed("order-42", "order.created"),
				failed("x1", "x.happened"), failed("x2", "x.happened"), failed("y1", "y.happened"),
				ev(newOID, events.StatusNew, ago(time.Hour)),
				withType(ev("x-new", events.StatusNew, ago(time.Hour)), "x.happened"),
			)
			n, err := s.Requeue(t.Context(), tt.filter, tt.dryRun)
			if err != nil || n != tt.wantN {
				t.Fatalf("Requeue(%+v, dryRun %t) = %d, %v; want %d, nil", tt.filter, tt.dryRun, n, err, tt.wantN)
			}
			want := map[string]events.Status{newOID.Hex(): events.StatusNew, "x-new": events.StatusNew}
			for _, id := range all {
				want[id] = events.StatusFailed
			}
			for _, id := range tt.wantNew {
				want[id] = events.StatusNew
			}
			if diff := cmp.Diff(want, statuses(t, coll)); diff != "" {
				t.Errorf("statuses after requeue (-want +got):\n%s", diff)
			}
			for _, id := range tt.wantNew {
				var key any = id
				if id == oid.Hex() {
					key = oid
				}
				e := get(t, coll, key)
				if e.Attempts != 0 || e.LastError != "gave up after 10 attempts" {
					t.Errorf("%s: attempts %d lastError %q; want 0 and the last error kept", id, e.Attempts, e.LastError)
				}
				for _, f := range []string{events.FieldWorkerID, events.FieldProcessingAt, events.FieldClaimToken, events.FieldRetryAt, events.FieldFailedAt} {
					if has(t, coll, key, f) {
						t.Errorf("%s: %s still set after requeue", id, f)
					}
				}
			}
		})
	}
}

func TestRequeueNeedsAFilter(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	for _, dryRun := range []bool{false, true} {
		n, err := s.Requeue(t.Context(), mongo.RequeueFilter{}, dryRun)
		if err == nil || n != 0 || !strings.Contains(err.Error(), "--all") {
			t.Errorf("Requeue(empty filter, dryRun %t) = %d, %v; want 0 and an error naming --id, --type or --all", dryRun, n, err)
		}
	}
}

func TestFind(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	oid := bson.NewObjectID()
	insert(t, coll,
		ev(oid, events.StatusNew, ago(time.Hour)),
		ev("order-42", events.StatusPublished, ago(time.Hour)),
	)
	for _, tt := range []struct {
		arg    string
		wantID any
	}{{oid.Hex(), oid}, {"order-42", "order-42"}} {
		raw, err := s.Find(t.Context(), tt.arg)
		if err != nil {
			t.Errorf("Find(%q): %v", tt.arg, err)
			continue
		}
		var got struct {
			ID any `bson:"_id"`
		}
		if err := bson.Unmarshal(raw, &got); err != nil {
			t.Fatalf("decode %q: %v", tt.arg, err)
		}
		if diff := cmp.Diff(tt.wantID, got.ID); diff != "" {
			t.Errorf("Find(%q) _id (-want +got):\n%s", tt.arg, diff)
		}
	}
	missing := bson.NewObjectID().Hex()
	if _, err := s.Find(t.Context(), missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("Find(%q) of no event = %v, want an error naming the id", missing, err)
	}
}

// TestClaimIsSorted checks oldest-first on a batch where insertion order is
// the reverse of createdAt order.
func TestClaimIsSorted(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	var docs []bson.D
	var want []string
	for i := range 50 {
		// createdAt descending with insertion order, so natural order is wrong.
		docs = append(docs, ev(fmt.Sprintf("e%02d", i), events.StatusNew, ago(time.Duration(i)*time.Second)))
		want = append(want, fmt.Sprintf("e%02d", i))
	}
	insert(t, coll, docs...)
	sort.Sort(sort.Reverse(sort.StringSlice(want)))
	got, _, err := claimN(t.Context(), s, lease("a"), 20)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if diff := cmp.Diff(want[:20], ids(got), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("claim of 20 from 50: ids (-want +got):\n%s", diff)
	}
}

// claimN claims up to n events with no byte bound, as Claim did before
// it took a ClaimLimit.
func claimN(ctx context.Context, s *mongo.Store, lease events.Lease, n int) ([]events.Claimed, bool, error) {
	res, err := s.Claim(ctx, lease, events.ClaimLimit{Events: n})
	return res.Claimed, res.More, err
}
