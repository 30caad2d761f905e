package mongo_test

import (
	"errors"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// fenceLimit is a claim limit in partition p alone, held under tenure.
func fenceLimit(p int, tenure int64) events.ClaimLimit {
	owned := make([]bool, events.Partitions)
	owned[p] = true
	tenures := make([]int64, events.Partitions)
	tenures[p] = tenure
	return events.ClaimLimit{Events: 100, Owned: owned, Tenures: tenures, Ordered: true, FailedHolds: true}
}

// fenceOf reads partition p's fence document: its tenure and how many
// writes it took.
func fenceOf(t *testing.T, s *mongo.Store, p int) (tenure, writes int64) {
	t.Helper()
	var d struct {
		Tenure int64 `bson:"tenure"`
		Writes int64 `bson:"writes"`
	}
	if err := s.Fences().FindOne(t.Context(), bson.D{{Key: "_id", Value: "fence/" + strconv.Itoa(p)}}).Decode(&d); err != nil {
		t.Fatalf("read the fence of partition %d: %v", p, err)
	}
	return d.Tenure, d.Writes
}

// Without transactions (FerretDB) the claim is as before: the tenures are
// not checked, no fence document is written, and a claim under a tenure
// older than one seen before still claims. The time fence alone keeps the
// owners apart there.
func TestNoFencesWithoutTransactions(t *testing.T) {
	t.Parallel()
	s, coll := setup(t)
	if s.SupportsTransactions() {
		t.Fatal("FerretDB reports transactions")
	}
	base := ago(time.Hour)
	var docs []bson.D
	for i := range 4 {
		docs = append(docs, ev(strconv.Itoa(i), events.StatusNew, base.Add(time.Duration(i)*time.Second),
			field(events.FieldAggregateType, "order"), field(events.FieldAggregateID, "o-"+strconv.Itoa(i))))
	}
	insert(t, coll, docs...)
	for i, tenure := range []int64{7, 3} { // the second claim's tenure has passed
		res, err := s.Claim(t.Context(), lease("w"+strconv.Itoa(i)), everyPartition(tenure, 2))
		if err != nil {
			t.Fatalf("Claim under tenure %d: %v", tenure, err)
		}
		if len(res.Claimed) != 2 {
			t.Errorf("Claim under tenure %d claimed %d events, want 2", tenure, len(res.Claimed))
		}
	}
	if n, err := s.Fences().CountDocuments(t.Context(), bson.D{}); err != nil || n != 0 {
		t.Errorf("fence documents = %d, %v; want none without transactions", n, err)
	}
}

// everyPartition is a claim of up to n events in every partition, under
// the same tenure.
func everyPartition(tenure int64, n int) events.ClaimLimit {
	owned := make([]bool, events.Partitions)
	tenures := make([]int64, events.Partitions)
	for p := range owned {
		owned[p], tenures[p] = true, tenure
	}
	return events.ClaimLimit{Events: n, Owned: owned, Tenures: tenures}
}

// The fence's writes outside a transaction, one after the other, on
// FerretDB: a later tenure raises the fence, an earlier one is refused
// (ErrFenced, then the partition is left out of the reads under that
// tenure without a command), and a store that raised the fence does not
// raise it again under the same tenure. Sequential, so FerretDB's
// non-atomic update does not matter; the races are the container suite's.
func TestFenceRaiseOnFerretDB(t *testing.T) {
	t.Parallel()
	a, _ := setup(t)
	other := func() *mongo.Store {
		return mongo.New(a.Collection().Database().Client(), mongo.Config{
			Database: a.Collection().Database().Name(), Logger: slog.New(slog.DiscardHandler)})
	}
	b, late := other(), other()
	ctx := t.Context()
	if err := mongo.EnsureFences(ctx, a); err != nil {
		t.Fatalf("EnsureFences: %v", err)
	}
	if err := mongo.EnsureFences(ctx, b); err != nil { // every replica, at every start
		t.Fatalf("EnsureFences again: %v", err)
	}
	if n, err := a.Fences().CountDocuments(ctx, bson.D{}); err != nil || n != events.Partitions {
		t.Fatalf("fence documents = %d, %v; want %d", n, err, events.Partitions)
	}
	const p = 5
	owned, err := mongo.RaiseFences(ctx, a, fenceLimit(p, 3))
	if err != nil || !owned[p] {
		t.Fatalf("a raises the fence to 3: owned %t, %v; want true, nil", owned[p], err)
	}
	if tenure, writes := fenceOf(t, a, p); tenure != 3 || writes != 1 {
		t.Errorf("fence after a's raise = tenure %d, %d writes; want 3, 1", tenure, writes)
	}
	if _, err := mongo.RaiseFences(ctx, a, fenceLimit(p, 3)); err != nil {
		t.Fatalf("a reads again under 3: %v", err)
	}
	if _, writes := fenceOf(t, a, p); writes != 1 {
		t.Errorf("a raised the fence again under the same tenure: %d writes, want 1", writes)
	}
	if owned, err = mongo.RaiseFences(ctx, b, fenceLimit(p, 8)); err != nil || !owned[p] {
		t.Fatalf("b takes over and raises the fence to 8: owned %t, %v; want true, nil", owned[p], err)
	}
	if tenure, writes := fenceOf(t, a, p); tenure != 8 || writes != 2 {
		t.Errorf("fence after b's raise = tenure %d, %d writes; want 8, 2", tenure, writes)
	}
	// An owner of tenure 3 that has not raised it yet (a restart, another
	// store) is refused.
	_, err = mongo.RaiseFences(ctx, late, fenceLimit(p, 3))
	if !errors.Is(err, events.ErrFenced) {
		t.Fatalf("a read under passed tenure 3 = %v, want ErrFenced", err)
	}
	// It says the fence's tenure, which the ownership numbers its next
	// term above.
	var fenced *events.FencedError
	if !errors.As(err, &fenced) || fenced.Fences[p] != 8 {
		t.Errorf("a read under passed tenure 3 = %v, want a FencedError naming partition %d's fence at 8", err, p)
	}
	if tenure, _ := fenceOf(t, a, p); tenure != 8 {
		t.Errorf("fence after a refused raise = tenure %d, want 8", tenure)
	}
	owned, err = mongo.RaiseFences(ctx, late, fenceLimit(p, 3))
	if err != nil || owned[p] {
		t.Errorf("the next read under tenure 3: owned %t, %v; want the partition left out, no error", owned[p], err)
	}
	// Taken again under a later tenure, the partition is read again.
	if owned, err = mongo.RaiseFences(ctx, late, fenceLimit(p, 9)); err != nil || !owned[p] {
		t.Errorf("a read under tenure 9: owned %t, %v; want true, nil", owned[p], err)
	}
	// A fence document deleted by hand is created again, and the next
	// raise writes it.
	if _, err := a.Fences().DeleteOne(ctx, bson.D{{Key: "_id", Value: "fence/" + strconv.Itoa(p+1)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := mongo.RaiseFences(ctx, a, fenceLimit(p+1, 4)); err == nil || errors.Is(err, events.ErrFenced) {
		t.Fatalf("a raise of a deleted fence = %v, want an error that is not ErrFenced", err)
	}
	if owned, err = mongo.RaiseFences(ctx, a, fenceLimit(p+1, 4)); err != nil || !owned[p+1] {
		t.Errorf("the raise after the fence was created again: owned %t, %v; want true, nil", owned[p+1], err)
	}
}
