package mongo_test

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// rejected returns the ids of a claim's rejects whose FAILED write
// succeeded, sorted, and fails the test on any whose write failed.
func rejectedIDs(t *testing.T, rs []events.Rejected) []string {
	t.Helper()
	var out []string
	for _, r := range rs {
		if r.Err != nil {
			t.Errorf("reject %v: FAILED write failed: %v", r.ID, r.Err)
		}
		out = append(out, idString(r.ID))
	}
	sort.Strings(out)
	return out
}

// Worker-managed fields of the wrong type: null is absent (null attempts is
// claimed as 0 and becomes 1), any other wrong type makes the event FAILED
// in the same claim, naming the field, without touching it; the valid
// events around them are claimed in the same claim.
func TestClaimManagedFieldTypes(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		insert(t, coll,
			ev("ok-1", events.StatusNew, ago(9*time.Minute)),
			ev("attempts-string", events.StatusNew, ago(8*time.Minute), field(events.FieldAttempts, "2")),
			ev("attempts-null", events.StatusNew, ago(7*time.Minute), field(events.FieldAttempts, nil)),
			ev("attempts-double", events.StatusNew, ago(6*time.Minute), field(events.FieldAttempts, 2.0)),
			ev("attempts-fraction", events.StatusNew, ago(5*time.Minute), field(events.FieldAttempts, 2.5)),
			ev("processingAt-string", events.StatusNew, ago(4*time.Minute), field(events.FieldProcessingAt, "yesterday")),
			ev("retryAt-string", events.StatusNew, ago(3*time.Minute), field(events.FieldRetryAt, "soon")),
			ev("nulls", events.StatusNew, ago(2*time.Minute), field(events.FieldRetryAt, nil),
				field(events.FieldClaimToken, nil), field(events.FieldWorkerID, nil), field(events.FieldProcessingAt, nil)),
			ev("ok-2", events.StatusNew, ago(1*time.Minute)),
		)
		l := lease("a")
		res, err := s.Claim(t.Context(), l, events.ClaimLimit{Events: 100})
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		wantClaimed := []string{"attempts-double", "attempts-null", "nulls", "ok-1", "ok-2"}
		got := ids(res.Claimed)
		sort.Strings(got)
		if diff := cmp.Diff(wantClaimed, got); diff != "" {
			t.Errorf("claimed (-want +got):\n%s", diff)
		}
		wantAttempts := map[string]int{"attempts-double": 3, "attempts-null": 1, "nulls": 1, "ok-1": 1, "ok-2": 1}
		for _, c := range res.Claimed {
			if c.Attempts != wantAttempts[idString(c.ID)] {
				t.Errorf("claimed %v: Attempts %d, want %d", c.ID, c.Attempts, wantAttempts[idString(c.ID)])
			}
			if e := get(t, coll, c.ID); e.Status != events.StatusProcessing || e.Attempts != wantAttempts[idString(c.ID)] ||
				e.ClaimToken != l.Token || !e.RetryAt.IsZero() {
				t.Errorf("claimed %v stored as %s attempts %d token %q retryAt %s; want PROCESSING, attempts %d, this lease, no retryAt",
					c.ID, e.Status, e.Attempts, e.ClaimToken, e.RetryAt, wantAttempts[idString(c.ID)])
			}
		}
		if diff := cmp.Diff([]string{"attempts-fraction", "attempts-string", "processingAt-string", "retryAt-string"},
			rejectedIDs(t, res.Rejected)); diff != "" {
			t.Errorf("rejected (-want +got):\n%s", diff)
		}
		for id, want := range map[string]struct {
			field string
			value any
		}{
			"attempts-string":     {`"attempts" must be a whole number of 0 or more, got string`, "2"},
			"attempts-fraction":   {`"attempts" must be a whole number of 0 or more, got double 2.5`, 2.5},
			"processingAt-string": {`"processingAt" must be a date, got string`, "yesterday"},
			"retryAt-string":      {`"retryAt" must be a date, got string`, "soon"},
		} {
			raw, err := coll.FindOne(t.Context(), bson.D{{Key: "_id", Value: id}}).Raw()
			if err != nil {
				t.Fatal(err)
			}
			status := raw.Lookup(events.FieldStatus).StringValue()
			lastError, _ := raw.Lookup(events.FieldLastError).StringValueOK()
			if status != string(events.StatusFailed) || !strings.Contains(lastError, want.field) {
				t.Errorf("%s: status %s lastError %q; want FAILED naming %s", id, status, lastError, want.field)
			}
			if _, ok := raw.Lookup(events.FieldFailedAt).TimeOK(); !ok {
				t.Errorf("%s: no failedAt", id)
			}
			// The bad field is left as it was, for the operator.
			bad := strings.Split(want.field, `"`)[1]
			var got any
			switch v := raw.Lookup(bad); v.Type {
			case bson.TypeString:
				got = v.StringValue()
			case bson.TypeDouble:
				got = v.Double()
			}
			if got != want.value {
				t.Errorf("%s: %s = %v after the FAILED write, want it untouched (%v)", id, bad, got, want.value)
			}
		}
	})
}

// The claim's update refused by the server because of one document (here
// attempts at the largest long, which a $inc overflows): the batch is
// claimed one event at a time, that event is FAILED with the server's
// reason, and the rest are claimed.
func TestClaimFallsBackWhenTheServerRefusesOneDocument(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	var docs []bson.D
	for i := range 6 {
		docs = append(docs, ev(fmt.Sprintf("ok-%d", i), events.StatusNew, ago(time.Duration(10-i)*time.Minute)))
	}
	docs = append(docs, ev("overflow", events.StatusNew, ago(7*time.Minute+30*time.Second), field(events.FieldAttempts, int64(math.MaxInt64))))
	insert(t, coll, docs...)

	res, err := s.Claim(t.Context(), lease("a"), events.ClaimLimit{Events: 100})
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	got := ids(res.Claimed)
	sort.Strings(got)
	if diff := cmp.Diff([]string{"ok-0", "ok-1", "ok-2", "ok-3", "ok-4", "ok-5"}, got); diff != "" {
		t.Errorf("claimed (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"overflow"}, rejectedIDs(t, res.Rejected)); diff != "" {
		t.Errorf("rejected (-want +got):\n%s", diff)
	}
	for _, c := range res.Claimed {
		if e := get(t, coll, c.ID); e.Status != events.StatusProcessing || e.Attempts != 1 || c.Attempts != 1 {
			t.Errorf("claimed %v: stored %s attempts %d, Claimed.Attempts %d; want PROCESSING, 1", c.ID, e.Status, e.Attempts, c.Attempts)
		}
	}
	raw, err := coll.FindOne(t.Context(), bson.D{{Key: "_id", Value: "overflow"}}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	lastError, _ := raw.Lookup(events.FieldLastError).StringValueOK()
	if raw.Lookup(events.FieldStatus).StringValue() != string(events.StatusFailed) ||
		!strings.HasPrefix(lastError, "claim refused by the server: ") || len(lastError) <= len("claim refused by the server: ") {
		t.Errorf("overflow: status %s lastError %q; want FAILED with the server's reason", raw.Lookup(events.FieldStatus), lastError)
	}
	if n, _ := raw.Lookup(events.FieldAttempts).AsInt64OK(); n != math.MaxInt64 {
		t.Errorf("overflow: attempts %v, want it untouched", raw.Lookup(events.FieldAttempts))
	}
}

// A document too close to the 16 MiB limit for the worker's writes is
// FAILED at claim time, naming its size and the limit; the events around
// it are claimed.
func TestClaimFailsDocumentNearSizeLimit(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	// About 1 KiB under the limit: inside ManagedReserveBytes.
	big := ev("big", events.StatusNew, ago(2*time.Minute),
		field("pad", strings.Repeat("x", events.MaxDocumentBytes-1<<10)))
	insert(t, coll, ev("before", events.StatusNew, ago(3*time.Minute)), big, ev("after", events.StatusNew, ago(time.Minute)))

	res, err := s.Claim(t.Context(), lease("a"), events.ClaimLimit{Events: 100})
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if diff := cmp.Diff([]string{"before", "after"}, ids(res.Claimed)); diff != "" {
		t.Errorf("claimed (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"big"}, rejectedIDs(t, res.Rejected)); diff != "" {
		t.Errorf("rejected (-want +got):\n%s", diff)
	}
	size := testenv.Marshal(t, big)
	raw, err := coll.FindOne(t.Context(), bson.D{{Key: "_id", Value: "big"}}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	lastError, _ := raw.Lookup(events.FieldLastError).StringValueOK()
	if raw.Lookup(events.FieldStatus).StringValue() != string(events.StatusFailed) ||
		!strings.Contains(lastError, "16777216-byte document limit") || !strings.Contains(lastError, fmt.Sprintf("is %d bytes", len(size))) {
		t.Errorf("big: status %s lastError %q; want FAILED naming its size (%d) and the limit", raw.Lookup(events.FieldStatus), lastError, len(size))
	}
}

// A small byte bound splits a backlog of larger documents into batches
// that each respect it, always taking at least one document, in order.
func TestClaimByteBound(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, func(t *testing.T, s *mongo.Store, coll *driver.Collection) {
		const n, pad, bound = 10, 10 << 10, 35 << 10 // three 10 KiB documents fit
		var docs []bson.D
		var want []string
		for i := range n {
			id := fmt.Sprintf("e%02d", i)
			extra := []bson.E{field("pad", strings.Repeat("x", pad))}
			if i%3 == 1 { // a due retry among them, merged in order
				extra = append(extra, field(events.FieldRetryAt, ago(time.Hour)))
			}
			docs = append(docs, ev(id, events.StatusNew, ago(time.Duration(n-i)*time.Minute), extra...))
			want = append(want, id)
		}
		// One larger than the bound on its own: taken alone.
		docs = append(docs, ev("huge", events.StatusNew, ago(0), field("pad", strings.Repeat("x", 2*bound))))
		want = append(want, "huge")
		insert(t, coll, docs...)

		var got []string
		var sizes []int
		for range 20 {
			res, err := s.Claim(t.Context(), lease("a"), events.ClaimLimit{Events: 100, Bytes: bound})
			if err != nil {
				t.Fatalf("Claim: %v", err)
			}
			if len(res.Claimed) == 0 {
				if res.More {
					t.Error("empty claim: More = true")
				}
				break
			}
			total := 0
			for _, c := range res.Claimed {
				total += len(c.Doc)
				got = append(got, idString(c.ID))
			}
			sizes = append(sizes, len(res.Claimed))
			if total > bound && len(res.Claimed) > 1 {
				t.Errorf("a batch of %d documents holds %d bytes, past the bound %d", len(res.Claimed), total, bound)
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("claimed in order (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]int{3, 3, 3, 1, 1}, sizes); diff != "" {
			t.Errorf("batch sizes (-want +got):\n%s", diff)
		}
	})
}

// A backlog of large documents must not stall the claim: FerretDB, unlike
// MongoDB, puts every document a find asks for into one reply, and four of
// 13 MiB make a reply over the driver's 48 MB message limit. The claim that
// meets it fails; the next reads one document per reply and takes the
// batch its byte bound allows.
func TestClaimLargeDocumentsShrinkTheReply(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	const docs, size = 4, 13 << 20
	for i := range docs {
		id := fmt.Sprintf("big%d", i)
		insert(t, coll, ev(id, events.StatusNew, ago(time.Duration(docs-i)*time.Minute), field("pad", strings.Repeat("x", size))))
	}
	limit := events.ClaimLimit{Events: 100, Bytes: 64 << 20}
	var claimed int
	for run := 0; run < 3 && claimed < docs; run++ {
		res, err := s.Claim(t.Context(), lease("a"), limit)
		if err != nil {
			t.Logf("claim %d: %v", run, err)
			continue
		}
		claimed += len(res.Claimed)
	}
	if claimed != docs {
		t.Fatalf("claimed %d of %d large documents in three claims", claimed, docs)
	}
}

// TestClaim runs with both of the claim's find strategies: the split one
// MongoDB uses and the single find FerretDB uses must claim the same events.
func TestClaim(t *testing.T) {
	t.Parallel()
	eachClaimStrategy(t, testClaim)
}

func testClaim(t *testing.T, s *mongo.Store, coll *driver.Collection) {
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
		want := events.Event{Status: events.StatusProcessing, Delivery: events.Delivery{WorkerID: tt.lease.WorkerID,
			ClaimToken: tt.lease.Token, ProcessingAt: tt.lease.At, Attempts: tt.attempts}}
		gotE := events.Event{Status: e.Status, Delivery: events.Delivery{WorkerID: e.WorkerID, ClaimToken: e.ClaimToken,
			ProcessingAt: e.ProcessingAt, Attempts: e.Attempts, RetryAt: e.RetryAt}}
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
