package mongo_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

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

// TestRetryNow: a NEW event backing off before a retry, named by id, is
// made due now (retryAt unset, attempts and lastError kept); nothing else
// is touched.
func TestRetryNow(t *testing.T) {
	t.Parallel()
	oid := bson.NewObjectID()
	backingOff := func(id any, typ string, retryAt time.Time) bson.D {
		return withType(ev(id, events.StatusNew, ago(time.Hour),
			field(events.FieldAttempts, 3), field(events.FieldLastError, "broker returned the message as unroutable"),
			field(events.FieldRetryAt, retryAt)), typ)
	}
	backing := []string{oid.Hex(), "far", "soon"}
	tests := []struct {
		name    string
		filter  mongo.RequeueFilter
		dryRun  bool
		wantN   int
		wantDue []string // events whose retryAt must be gone
	}{
		{"by ObjectID hex", mongo.RequeueFilter{IDs: []string{oid.Hex()}}, false, 1, []string{oid.Hex()}},
		{"a far-future retryAt", mongo.RequeueFilter{IDs: []string{"far"}}, false, 1, []string{"far"}},
		{"several, some not backing off", mongo.RequeueFilter{IDs: []string{"far", "soon", "plain-new", "failed", "processing", "no-such"}}, false, 2, []string{"far", "soon"}},
		{"by id and type: both must match", mongo.RequeueFilter{IDs: []string{"far", "soon"}, Type: "y.happened"}, false, 1, []string{"soon"}},
		{"without ids: nothing", mongo.RequeueFilter{All: true}, false, 0, nil},
		{"type alone: nothing", mongo.RequeueFilter{Type: "x.happened"}, false, 0, nil},
		{"dry run counts and changes nothing", mongo.RequeueFilter{IDs: []string{"far", "soon"}}, true, 2, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, coll := setup(t)
			insert(t, coll,
				backingOff(oid, "x.happened", base.Add(time.Minute)),
				backingOff("far", "x.happened", base.AddDate(10, 0, 0)),
				backingOff("soon", "y.happened", base.Add(time.Second)),
				ev("plain-new", events.StatusNew, ago(time.Hour)),
				ev("failed", events.StatusFailed, ago(time.Hour), field(events.FieldRetryAt, base.Add(time.Hour))),
				ev("processing", events.StatusProcessing, ago(time.Hour), field(events.FieldRetryAt, base.Add(time.Hour))),
			)
			n, err := s.RetryNow(t.Context(), tt.filter, tt.dryRun)
			if err != nil || n != tt.wantN {
				t.Fatalf("RetryNow(%+v, dryRun %t) = %d, %v; want %d, nil", tt.filter, tt.dryRun, n, err, tt.wantN)
			}
			for _, id := range append(backing, "failed", "processing") {
				var key any = id
				if id == oid.Hex() {
					key = oid
				}
				wantRetryAt := !slices.Contains(tt.wantDue, id)
				if got := has(t, coll, key, events.FieldRetryAt); got != wantRetryAt {
					t.Errorf("%s: has retryAt %t, want %t", id, got, wantRetryAt)
				}
				e := get(t, coll, key)
				if slices.Contains(backing, id) && (e.Status != events.StatusNew || e.Attempts != 3 || e.LastError == "") {
					t.Errorf("%s: status %s attempts %d lastError %q; want NEW, 3 and the last error kept", id, e.Status, e.Attempts, e.LastError)
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
