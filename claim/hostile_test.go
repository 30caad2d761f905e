package claim

// The hostile-document suite: no single document in the outbox may stop
// the relay. Each class of hostile document is put among hostileValid
// valid events and relayed by a real claimer (mongo.Store on FerretDB or
// OUTBOX_TEST_MONGO_URI, broker.Publisher on RabbitMQ). Whatever the
// hostile document is, every valid event must be delivered within
// hostileValidRuns claim runs, the hostile one must end delivered or FAILED
// with a lastError that names its field (and its limit, where it broke
// one), no run may fail or panic, the publisher must be ready again after
// every run, and nothing may be left PROCESSING.

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/metrics"
)

func TestHostileDocuments(t *testing.T) {
	t.Parallel()
	for _, tc := range hostileCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.cfg.MaxBodyBytes == 0 {
				tc.cfg.MaxBodyBytes = hostileMaxBody
			}
			relayHostile(t, tc.cfg, tc.hostile)
		})
	}
}

// hostileEvent is what the suite reads back of a stored event: read with
// tolerant accessors, since a hostile document may hold anything.
type hostileEvent struct {
	status    string
	lastError string
}

// docKey names a document by its _id: an ObjectId as hex, a string as is,
// anything else as Extended JSON.
func docKey(v bson.RawValue) string {
	if id, ok := v.ObjectIDOK(); ok {
		return id.Hex()
	}
	if s, ok := v.StringValueOK(); ok {
		return s
	}
	return v.String()
}

func docKeyOf(t *testing.T, doc any) string {
	t.Helper()
	raw, ok := doc.(bson.Raw)
	if !ok {
		var err error
		if raw, err = bson.Marshal(doc); err != nil {
			t.Fatalf("marshal hostile document: %v", err)
		}
	}
	v, err := raw.LookupErr(events.FieldID)
	if err != nil {
		t.Fatalf("hostile document without _id: %v", err)
	}
	return docKey(v)
}

// readEvents reads the status and lastError of every stored event, by
// docKey. The projection keeps 16 MiB payloads out of the reply.
func readEvents(t *testing.T, coll *driver.Collection) map[string]hostileEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	proj := bson.D{{Key: events.FieldStatus, Value: 1}, {Key: events.FieldLastError, Value: 1}}
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetProjection(proj))
	if err != nil {
		t.Fatalf("find events: %v", err)
	}
	defer cur.Close(ctx)
	out := map[string]hostileEvent{}
	for cur.Next(ctx) {
		var e hostileEvent
		if v, err := cur.Current.LookupErr(events.FieldStatus); err == nil {
			e.status, _ = v.StringValueOK()
		}
		if v, err := cur.Current.LookupErr(events.FieldLastError); err == nil {
			e.lastError, _ = v.StringValueOK()
		}
		id, err := cur.Current.LookupErr(events.FieldID)
		if err != nil {
			t.Fatalf("stored event without _id: %s", cur.Current)
		}
		out[docKey(id)] = e
	}
	if err := cur.Err(); err != nil {
		t.Fatalf("read events: %v", err)
	}
	return out
}

// hostilePublisher is newPublisher with its log lines kept in logs.
func hostilePublisher(t *testing.T, exchange string, logs *testenv.LogBuffer) *broker.Publisher {
	t.Helper()
	return startPublisher(t, broker.Config{Exchange: exchange, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond})
}

// safeRunOnce is one claim run that reports a panic as an error.
func safeRunOnce(ctx context.Context, c *Claimer) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	_, err = c.runOnce(ctx)
	return err
}

// failedTotal sums outbox_events_failed_total over its reasons, and lists
// them.
func failedTotal(t *testing.T, m *metrics.Metrics) (float64, map[string]float64) {
	t.Helper()
	ch := make(chan prometheus.Metric, 16)
	go func() { m.Failed.Collect(ch); close(ch) }()
	by := map[string]float64{}
	var sum float64
	for pm := range ch {
		var d dto.Metric
		if err := pm.Write(&d); err != nil {
			t.Fatal(err)
		}
		reason := ""
		for _, l := range d.GetLabel() {
			if l.GetName() == "reason" {
				reason = l.GetValue()
			}
		}
		by[reason] += d.GetCounter().GetValue()
		sum += d.GetCounter().GetValue()
	}
	return sum, by
}

// relayHostile relays hostile documents among hostileValid valid events
// and checks everything the suite promises.
func relayHostile(t *testing.T, cfg Config, hostile []hostileDoc) {
	t.Helper()
	r := setup(t)
	logs := &testenv.LogBuffer{}
	pub := hostilePublisher(t, r.exchange, logs)
	cfg.WorkerID = "worker-hostile"
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	cfg.Metrics = metrics.New(nil)
	c, err := New(r.store, pub, cfg)
	if err != nil {
		t.Fatalf("claim.New: %v", err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("worker log:\n%s", lastLines(logs.String(), 30))
		}
	}()

	// The hostile documents sort among the valid ones: insertEvents spaces
	// those 1 ms apart from an hour ago.
	start := time.Now().Add(-time.Hour)
	valid := insertEvents(t, r.coll, hostileValid, "order.created")
	keys := make([]string, len(hostile))
	for i, h := range hostile {
		at := start.Add(time.Duration((i+1)*hostileValid/(len(hostile)+1)) * time.Millisecond)
		doc := h.doc(t, at)
		keys[i] = docKeyOf(t, doc)
		ctx, cancel := context.WithTimeout(t.Context(), waitFor)
		_, err := r.coll.InsertOne(ctx, doc)
		cancel()
		if err != nil {
			t.Fatalf("insert hostile document %q: %v", trim(keys[i]), err)
		}
	}

	validRun := 0
	var runErrs []string
	for run := 1; run <= hostileMaxRuns; run++ {
		testenv.WaitReady(t, pub.Ready)
		if err := safeRunOnce(t.Context(), c); err != nil {
			runErrs = append(runErrs, fmt.Sprintf("run %d: %v", run, err))
		}
		all := readEvents(t, r.coll)
		if validRun == 0 && allStatus(all, valid, events.StatusPublished) {
			validRun = run
		}
		if validRun > 0 && settled(all, keys) {
			break
		}
	}
	for _, e := range runErrs {
		t.Errorf("claim run failed: %s", trim(e))
	}
	testenv.WaitReady(t, pub.Ready)

	all := readEvents(t, r.coll)
	switch {
	case validRun == 0:
		t.Errorf("valid events not all PUBLISHED after %d claim runs: %v", hostileMaxRuns, countStatus(all, valid))
	case validRun > hostileValidRuns:
		t.Errorf("valid events all PUBLISHED only after %d claim runs, want at most %d", validRun, hostileValidRuns)
	}
	if n := countStatus(all, slices.Collect(maps.Keys(all)))[string(events.StatusProcessing)]; n > 0 {
		t.Errorf("%d events left PROCESSING", n)
	}
	// Every PUBLISHED event must have been received under its own message
	// id; the valid events that are not PUBLISHED are reported above.
	var wantIDs []string
	for _, id := range valid {
		if all[id].status == string(events.StatusPublished) {
			wantIDs = append(wantIDs, id)
		}
	}
	failed := 0
	for i, h := range hostile {
		k, e := keys[i], all[keys[i]]
		switch {
		case e.status == string(events.StatusFailed):
			failed++
			for _, alts := range h.mention {
				if !containsAny(e.lastError, alts) {
					t.Errorf("hostile %q: FAILED with lastError %q, which does not mention %s",
						trim(k), trim(e.lastError), strings.Join(alts, " or "))
				}
			}
			t.Logf("hostile %q: FAILED: %s", trim(k), trim(e.lastError))
		case e.status == string(events.StatusPublished) && h.want == wantDeliveredOrFailed:
			wantIDs = append(wantIDs, k)
			t.Logf("hostile %q: PUBLISHED", trim(k))
		default:
			t.Errorf("hostile %q: %s (lastError %q) after %d runs, want %s",
				trim(k), e.status, trim(e.lastError), hostileMaxRuns, h.want)
		}
	}
	for k, e := range all {
		if e.status == string(events.StatusFailed) && !slices.Contains(keys, k) {
			t.Errorf("valid event %s FAILED: %s", k, e.lastError)
		}
	}
	if sum, by := failedTotal(t, cfg.Metrics); int(sum) != failed {
		t.Errorf("outbox_events_failed_total = %v %v, want %d (the FAILED hostile events)", sum, by, failed)
	} else if failed > 0 {
		t.Logf("outbox_events_failed_total by reason: %v", by)
	}
	testenv.Receive(t, r.deliveries, wantIDs, waitFor)
}

func allStatus(all map[string]hostileEvent, keys []string, s events.Status) bool {
	for _, k := range keys {
		if all[k].status != string(s) {
			return false
		}
	}
	return true
}

func settled(all map[string]hostileEvent, keys []string) bool {
	for _, k := range keys {
		if s := all[k].status; s != string(events.StatusPublished) && s != string(events.StatusFailed) {
			return false
		}
	}
	return true
}

func countStatus(all map[string]hostileEvent, keys []string) map[string]int {
	out := map[string]int{}
	for _, k := range keys {
		out[all[k].status]++
	}
	return out
}

func containsAny(s string, alts []string) bool {
	for _, a := range alts {
		if strings.Contains(strings.ToLower(s), strings.ToLower(a)) {
			return true
		}
	}
	return false
}

// trim shortens long ids and errors for test output.
func trim(s string) string {
	if len(s) > 300 {
		return s[:140] + fmt.Sprintf("...(%d bytes)...", len(s)) + s[len(s)-140:]
	}
	return s
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		lines[i] = trim(l)
	}
	return strings.Join(lines, "\n")
}
