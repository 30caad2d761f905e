package mongo_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// TestInterleavingsChecker runs the real store, as three replicas with
// stores of their own on one FerretDB collection, through interleavings
// a seeded scheduler draws: claims whose read and write are apart while
// other replicas, producers, operators (pause, resume, requeue, skip),
// recovery, clock jumps and give-backs of partitions go between them;
// byte-bounded batches; broker nacks (backoff) and failures. Then it
// drains, and checks the promise on the history, not the mechanism:
// every event ends PUBLISHED or FAILED with a reason, the first
// deliveries of each aggregate come in order (but past an event an
// operator skipped), and nothing is claimed while its type was paused.
//
// It is the store's half of the search: claim/plan/check searches a model
// of the protocol much faster. A failing seed replays alone:
// OUTBOX_TEST_STORE_CHECK_FIRST=<seed> OUTBOX_TEST_STORE_CHECK_SEEDS=1; make
// check-order runs more of them.
func TestInterleavingsChecker(t *testing.T) {
	t.Parallel()
	first, seeds := envInt(t, "OUTBOX_TEST_STORE_CHECK_FIRST", 1), envInt(t, "OUTBOX_TEST_STORE_CHECK_SEEDS", 3)
	db := testenv.Database(t)
	var total reached
	start := time.Now()
	for seed := first; seed < first+seeds; seed++ {
		r := newInterleaving(t, db, uint64(seed))
		if err := r.run(t.Context()); err != nil {
			t.Fatalf("seed %d: %v\nreplay: OUTBOX_TEST_STORE_CHECK_FIRST=%d OUTBOX_TEST_STORE_CHECK_SEEDS=1 go test -run TestInterleavingsChecker ./mongo/", seed, err, seed)
		}
		total.add(r.reached)
	}
	t.Logf("%d seeds in %s, %d operations; states reached: %s", seeds, time.Since(start).Round(time.Second), total.ops, total)
	if total.byteCuts == 0 || total.resumes == 0 || total.writesAfterGiveBack == 0 || total.parksAfterGiveBack == 0 {
		t.Errorf("the search did not reach every state it is there for: %s", total)
	}
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a whole number", name, v)
	}
	return n
}

// reached counts the states that known ordering holes needed: a claim cut by
// its byte bound, a resume with events written during its unpark, a claim
// write after a give-back of a partition it read in, a park after one.
type reached struct {
	ops, byteCuts, resumes, writesAfterGiveBack, parksAfterGiveBack int
}

func (r *reached) add(o reached) {
	r.ops += o.ops
	r.byteCuts += o.byteCuts
	r.resumes += o.resumes
	r.writesAfterGiveBack += o.writesAfterGiveBack
	r.parksAfterGiveBack += o.parksAfterGiveBack
}

func (r reached) String() string {
	return fmt.Sprintf("byte cuts %d, resumes with writes during the unpark %d, claim writes after a give-back %d, parks after a give-back %d",
		r.byteCuts, r.resumes, r.writesAfterGiveBack, r.parksAfterGiveBack)
}

const (
	checkReplicas   = 3
	checkKeys       = 10
	checkEvents     = 300
	checkMaxTicks   = 3000
	checkDrainTicks = 80
	checkStale      = 30 * time.Second
)

var checkTypes = []string{"a", "b", "c"}

// interleaving is one seed's run.
type interleaving struct {
	t        *testing.T
	rng      *rand.Rand
	coll     *driver.Collection
	replicas []*replica
	now      time.Time
	// owner and tenure are the partitions' ownership: a give-back moves
	// a partition to another replica under the next tenure.
	owner  [events.Partitions]int
	tenure [events.Partitions]int64
	// inserted are the events written, in insertion (and claim) order.
	inserted []string
	keyOf    map[string]string
	paused   map[string]bool
	skipped  map[string]bool
	// delivered are the first deliveries, in order.
	delivered []string
	seen      map[string]bool
	reached   reached
	seq       int
}

// replica is one worker's store and the claim it has in progress.
type replica struct {
	id    int
	store *mongo.Store
	// A claim: read (docs, under tenures), then written (lease, claimed),
	// then published.
	docs    []bson.Raw
	limit   events.ClaimLimit
	tenures []int64
	paused  map[string]bool // the types paused when the read began
	lease   events.Lease
	claimed []events.Claimed
	more    bool
}

func newInterleaving(t *testing.T, db *driver.Database, seed uint64) *interleaving {
	t.Helper()
	name := fmt.Sprintf("check_%d", seed)
	r := &interleaving{
		t: t, rng: rand.New(rand.NewPCG(seed, 40)), coll: db.Collection(name),
		now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), keyOf: map[string]string{},
		paused: map[string]bool{}, skipped: map[string]bool{}, seen: map[string]bool{},
	}
	_ = r.coll.Drop(t.Context())
	t.Cleanup(func() { _ = r.coll.Drop(context.WithoutCancel(t.Context())) })
	for i := range checkReplicas {
		s := mongo.New(db.Client(), mongo.Config{Database: db.Name(), Collection: name, Logger: slog.New(slog.DiscardHandler)})
		if err := s.Prepare(t.Context()); err != nil {
			t.Fatalf("Prepare: %v", err)
		}
		mongo.SetPausedMaxAge(s, 0)
		mongo.SetUnparkStepsMax(s, 1+r.rng.IntN(2))
		if r.rng.IntN(2) == 0 {
			mongo.SetMaxHeadRead(s, 20+r.rng.IntN(40))
		}
		r.replicas = append(r.replicas, &replica{id: i, store: s})
	}
	for p := range events.Partitions {
		r.owner[p], r.tenure[p] = p%checkReplicas, 1
	}
	return r
}

// run interleaves until every event is written and many steps have run,
// then drains without faults, and checks the outcome.
func (r *interleaving) run(ctx context.Context) error {
	for tick := 0; tick < checkMaxTicks && len(r.inserted) < checkEvents; tick++ {
		if err := r.step(ctx); err != nil {
			return err
		}
	}
	if err := r.drain(ctx); err != nil {
		return err
	}
	return r.check(ctx)
}

// step runs one action the seed draws.
func (r *interleaving) step(ctx context.Context) error {
	r.reached.ops++
	r.now = r.now.Add(time.Duration(r.rng.IntN(200)) * time.Millisecond)
	switch n := r.rng.IntN(100); {
	case n < 12:
		return r.produce(ctx)
	case n < 70:
		return r.advance(ctx, r.replicas[r.rng.IntN(checkReplicas)], true)
	case n < 76:
		return r.pauseOrResume(ctx)
	case n < 80:
		return r.operateFailed(ctx)
	case n < 84:
		r.giveBack()
	case n < 87:
		r.now = r.now.Add(checkStale + time.Second) // a clock jump past the stale threshold
	case n < 90:
		_, _, err := r.replicas[0].store.RecoverStale(ctx, r.now.Add(-checkStale), r.now, 20)
		return err
	}
	return nil
}

// produce writes a few events, some large enough for a byte bound to cut.
func (r *interleaving) produce(ctx context.Context) error {
	if len(r.inserted) >= checkEvents {
		return nil
	}
	var docs []any
	for range 1 + r.rng.IntN(6) {
		r.seq++
		id := fmt.Sprintf("e%04d", r.seq)
		agg := fmt.Sprint("k", r.rng.IntN(checkKeys))
		d := events.Draft{ID: id, Type: checkTypes[r.rng.IntN(len(checkTypes))], AggregateType: "order", AggregateID: agg,
			Payload: bson.D{{Key: "pad", Value: strings.Repeat("p", r.rng.IntN(3)*300)}}}
		doc, err := d.Document(r.now.Add(time.Duration(r.seq) * time.Millisecond))
		if err != nil {
			return err
		}
		docs = append(docs, doc)
		r.inserted = append(r.inserted, id)
		r.keyOf[id] = events.Key("order", agg)
		for _, rep := range r.replicas {
			if mongo.QueuedUnparkSteps(rep.store) > 0 {
				r.reached.resumes++
				break
			}
		}
	}
	_, err := r.coll.InsertMany(ctx, docs)
	return err
}

// owned is what replica holds now, and under which tenures.
func (r *interleaving) owned(rep *replica) ([]bool, []int64) {
	owned, tenures := make([]bool, events.Partitions), make([]int64, events.Partitions)
	for p := range events.Partitions {
		if r.owner[p] == rep.id {
			owned[p], tenures[p] = true, r.tenure[p]
		}
	}
	return owned, tenures
}

// still marks the partitions rep read in and holds under the same tenure.
func (r *interleaving) still(rep *replica) (owned []bool, lost bool) {
	_, now := r.owned(rep)
	owned = make([]bool, events.Partitions)
	for p := range events.Partitions {
		owned[p] = rep.tenures[p] != 0 && rep.tenures[p] == now[p]
		lost = lost || rep.tenures[p] != 0 && !owned[p]
	}
	return owned, lost
}

// advance moves rep's claim one phase on: read, write (and park), publish.
// faults draws nacks and failures.
func (r *interleaving) advance(ctx context.Context, rep *replica, faults bool) error {
	switch {
	case rep.claimed != nil:
		return r.publish(ctx, rep, faults)
	case rep.docs != nil:
		return r.write(ctx, rep)
	}
	owned, tenures := r.owned(rep)
	rep.limit = events.ClaimLimit{Events: 1 + r.rng.IntN(8), Ordered: true, FailedHolds: true, Owned: owned, Tenures: tenures, Draining: rep.more}
	if r.rng.IntN(2) == 0 {
		rep.limit.Bytes = 500 + r.rng.IntN(1200)
	}
	rep.tenures, rep.paused = tenures, cloneSet(r.paused)
	docs, more, err := rep.store.ReadClaimable(ctx, r.now, rep.limit)
	if err != nil {
		return fmt.Errorf("replica %d read: %w", rep.id, err)
	}
	rep.docs, rep.more = docs, more
	if rep.limit.Bytes > 0 && more && len(docs) < rep.limit.Events {
		r.reached.byteCuts++
	}
	return nil
}

// write claims what rep read in the partitions it still holds, then
// parks, as the claimer does under its hold.
func (r *interleaving) write(ctx context.Context, rep *replica) error {
	owned, lost := r.still(rep)
	var kept []bson.Raw
	for _, d := range rep.docs {
		if owned[events.Partition(d)] {
			kept = append(kept, d)
		}
	}
	limit := rep.limit
	limit.Owned = owned
	rep.lease = events.Lease{WorkerID: fmt.Sprint("r", rep.id), Token: fmt.Sprint("t", r.reached.ops), At: r.now}
	res, err := rep.store.ClaimRead(ctx, rep.lease, kept, limit)
	if err != nil {
		return fmt.Errorf("replica %d claim: %w", rep.id, err)
	}
	if _, err := rep.store.WriteParked(ctx, limit); err != nil {
		return fmt.Errorf("replica %d park: %w", rep.id, err)
	}
	if lost {
		r.reached.writesAfterGiveBack++
		r.reached.parksAfterGiveBack++
	}
	for _, c := range res.Claimed {
		if typ, _ := c.Doc.Lookup(events.FieldType).StringValueOK(); rep.paused[typ] {
			return fmt.Errorf("replica %d claimed %v of type %s, paused when its read began", rep.id, c.ID, typ)
		}
	}
	rep.docs, rep.claimed = nil, res.Claimed
	slices.SortFunc(rep.claimed, func(a, b events.Claimed) int { return events.CompareOrder(a.Doc, b.Doc) })
	return nil
}

// publish sends rep's claimed events in order, as the claimer does: each
// is confirmed (delivered, then marked), or with faults nacked (backoff)
// or failed. An event after a refused one of its key goes back too.
func (r *interleaving) publish(ctx context.Context, rep *replica, faults bool) error {
	var done, backoff, failed []any
	stopped := map[string]bool{}
	for _, c := range rep.claimed {
		id, key := fmt.Sprint(c.ID), r.keyOf[fmt.Sprint(c.ID)]
		switch n := r.rng.IntN(100); {
		case stopped[key] || faults && n < 6:
			stopped[key] = true
			backoff = append(backoff, c.ID)
		case faults && n < 8:
			stopped[key] = true
			failed = append(failed, c.ID)
		default:
			if !r.seen[id] {
				r.seen[id] = true
				r.delivered = append(r.delivered, id)
			}
			done = append(done, c.ID)
		}
	}
	rep.claimed = nil
	if len(done) > 0 {
		if _, err := rep.store.MarkPublished(ctx, rep.lease, done, r.now); err != nil {
			return err
		}
	}
	if len(backoff) > 0 {
		rel := events.Release{IDs: backoff, Status: events.StatusNew, RetryAt: r.now.Add(time.Duration(1+r.rng.IntN(3)) * time.Second), LastError: "nacked"}
		if _, err := rep.store.Release(ctx, rep.lease, rel); err != nil {
			return err
		}
	}
	if len(failed) > 0 {
		if _, err := rep.store.Release(ctx, rep.lease, events.Release{IDs: failed, Status: events.StatusFailed, LastError: "returned"}); err != nil {
			return err
		}
	}
	return nil
}

func (r *interleaving) pauseOrResume(ctx context.Context) error {
	typ := checkTypes[r.rng.IntN(len(checkTypes))]
	s := r.replicas[r.rng.IntN(checkReplicas)].store
	if r.paused[typ] {
		delete(r.paused, typ)
		_, err := s.Resume(ctx, typ)
		return err
	}
	r.paused[typ] = true
	_, err := s.Pause(ctx, events.Pause{Type: typ, By: "check", At: r.now})
	return err
}

// operateFailed requeues or skips a FAILED event.
func (r *interleaving) operateFailed(ctx context.Context) error {
	var doc struct {
		ID string `bson:"_id"`
	}
	err := r.coll.FindOne(ctx, bson.D{{Key: events.FieldStatus, Value: events.StatusFailed}, {Key: events.FieldSkippedAt, Value: nil}}).Decode(&doc)
	if errors.Is(err, driver.ErrNoDocuments) {
		return nil
	}
	if err != nil {
		return err
	}
	s := r.replicas[r.rng.IntN(checkReplicas)].store
	if r.rng.IntN(4) == 0 {
		r.skipped[doc.ID] = true
		_, err = s.Skip(ctx, []string{doc.ID}, "check", "test", r.now, false)
		return err
	}
	_, err = s.Requeue(ctx, mongo.RequeueFilter{IDs: []string{doc.ID}}, false)
	return err
}

// giveBack moves a partition of an aggregate to another replica: half the
// time one that a replica has read in and not written yet.
func (r *interleaving) giveBack() {
	p := events.PartitionOf(events.Key("order", fmt.Sprint("k", r.rng.IntN(checkKeys))))
	if rep := r.replicas[r.rng.IntN(checkReplicas)]; len(rep.docs) > 0 && r.rng.IntN(2) == 0 {
		p = events.Partition(rep.docs[r.rng.IntN(len(rep.docs))])
	}
	r.owner[p] = (r.owner[p] + 1 + r.rng.IntN(checkReplicas-1)) % checkReplicas
	r.tenure[p]++
}

// drain ends the faults: every type resumed, the FAILED events not
// skipped requeued, claims relayed until nothing is NEW or PROCESSING.
func (r *interleaving) drain(ctx context.Context) error {
	for typ := range r.paused {
		if _, err := r.replicas[0].store.Resume(ctx, typ); err != nil {
			return err
		}
	}
	clear(r.paused)
	for range checkDrainTicks {
		if _, err := r.replicas[0].store.Requeue(ctx, mongo.RequeueFilter{All: true}, false); err != nil {
			return err
		}
		r.now = r.now.Add(checkStale + time.Second)
		if _, _, err := r.replicas[0].store.RecoverStale(ctx, r.now.Add(-checkStale), r.now, 1000); err != nil {
			return err
		}
		for _, rep := range r.replicas {
			// What a read-ahead or a resumed read passes over waits for
			// their age (30 s of the wall clock, which a drain of virtual
			// time does not spend): the drain reads from the head.
			mongo.DropReadAhead(rep.store)
			mongo.SetUnparkStepsMax(rep.store, 0) // the worker's own pace
			// A claim begun before the clock jump is finished first,
			// then a whole one is run: read, write, publish.
			for range 2 {
				for first := true; first || rep.docs != nil || rep.claimed != nil; first = false {
					if err := r.advance(ctx, rep, false); err != nil {
						return err
					}
				}
			}
		}
		n, err := r.coll.CountDocuments(ctx, bson.D{{Key: events.FieldStatus, Value: bson.D{{Key: "$in", Value: bson.A{events.StatusNew, events.StatusProcessing}}}}})
		if err != nil {
			return err
		}
		if n == 0 && !slices.ContainsFunc(r.replicas, func(rep *replica) bool { return rep.claimed != nil || rep.docs != nil }) {
			return nil
		}
	}
	return nil
}

// check checks the promise on what happened.
func (r *interleaving) check(ctx context.Context) error {
	st := statusesOf(ctx, r.t, r.coll)
	for _, id := range r.inserted {
		switch st[id] {
		case events.StatusPublished:
		case events.StatusFailed:
			if !r.skipped[id] {
				return fmt.Errorf("%s is FAILED, not skipped, after the drain requeued every FAILED event", id)
			}
		default:
			var doc bson.M
			_ = r.coll.FindOne(ctx, bson.D{{Key: events.FieldID, Value: id}}).Decode(&doc)
			return fmt.Errorf("%s is %q after the drain: lost or stuck (%v; partition owned by replica %d)", id, st[id], doc, r.owner[events.PartitionOf(r.keyOf[id])])
		}
	}
	at := map[string]int{}
	for i, id := range r.delivered {
		at[id] = i
	}
	last := map[string]string{} // each key's latest event delivered so far, in insertion order
	for _, id := range r.inserted {
		if r.skipped[id] {
			continue // an operator let its aggregate pass it
		}
		key := r.keyOf[id]
		if prev, ok := last[key]; ok && cmp.Compare(at[id], at[prev]) < 0 {
			return fmt.Errorf("%s of %s first delivered before %s, written before it (first deliveries %v)", id, key, prev, r.delivered)
		}
		if _, ok := at[id]; ok {
			last[key] = id
		}
	}
	return nil
}

func statusesOf(ctx context.Context, t *testing.T, coll *driver.Collection) map[string]events.Status {
	t.Helper()
	cur, err := coll.Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var all []struct {
		ID     string        `bson:"_id"`
		Status events.Status `bson:"status"`
	}
	if err := cur.All(ctx, &all); err != nil {
		t.Fatal(err)
	}
	out := map[string]events.Status{}
	for _, e := range all {
		out[e.ID] = e.Status
	}
	return out
}

func cloneSet(m map[string]bool) map[string]bool {
	out := make(map[string]bool, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
