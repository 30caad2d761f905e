package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
)

// periodicExplainScenario: each command of the periodic jobs (the
// sampler's counts and oldest NEW event, the held count, recovery's resets,
// retention's find and delete) and of the console's pages is planned on an
// index and costs what it
// concerns, not the collection: it examines no more keys or documents than
// the events of the status it names, and a find no more than it returns
// (plus the FAILED events it skips). It explains the very commands the
// store sends, on an outbox whose published history dwarfs the rest.
func periodicExplainScenario(t *testing.T, s stack) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	rec := &mongotest.Recorder{}
	client := s.connect(t, testenv.ClientMaxPoolSize, func(o *options.ClientOptions) { o.SetMonitor(rec.Monitor()) })
	db := uniqueDatabase(t, client)
	store := mongo.New(client, mongo.Config{Database: db.Name()})
	if err := store.Prepare(ctx); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	const (
		history, oldHistory = 5000, 50 // PUBLISHED, of which oldHistory past retention
		backlog, holders    = 1000, 20 // NEW due, and NEW backing off (each holds an aggregate with a waiting event)
		failed, skipped     = 30, 10   // FAILED, of which skipped
		inFlight, stale     = 40, 10   // PROCESSING, of which stale
	)
	perStatus := map[events.Status]int{
		events.StatusPublished: history, events.StatusNew: backlog + 2*holders,
		events.StatusFailed: failed, events.StatusProcessing: inFlight,
	}
	var docs []any
	add := func(status events.Status, n int, extra func(i int) bson.D) {
		for i := range n {
			d := bson.D{{Key: "_id", Value: fmt.Sprintf("%s-%d", status, i)}, {Key: "type", Value: "t"}, {Key: "payload", Value: bson.D{}},
				{Key: "status", Value: status}, {Key: "createdAt", Value: now.Add(-time.Hour + time.Duration(i)*time.Millisecond)}}
			docs = append(docs, append(d, extra(i)...))
		}
	}
	key := func(i int) bson.D {
		return bson.D{{Key: "aggregateType", Value: "order"}, {Key: "aggregateId", Value: fmt.Sprintf("o-%d", i)}}
	}
	add(events.StatusPublished, history, func(i int) bson.D {
		at := now.Add(-time.Minute)
		if i < oldHistory {
			at = now.Add(-30 * 24 * time.Hour)
		}
		return bson.D{{Key: "publishedAt", Value: at}}
	})
	add(events.StatusNew, backlog+2*holders, func(i int) bson.D {
		switch {
		case i < holders: // the holders, oldest
			return append(key(i), bson.E{Key: "retryAt", Value: now.Add(time.Hour)}, bson.E{Key: "attempts", Value: 1})
		case i < 2*holders: // one waiting behind each
			return key(i - holders)
		}
		return nil
	})
	add(events.StatusFailed, failed, func(i int) bson.D {
		d := key(100 + i)
		if i < skipped {
			d = append(d, bson.E{Key: "skippedAt", Value: now})
		}
		return d
	})
	add(events.StatusProcessing, inFlight, func(i int) bson.D {
		at := now.Add(-time.Second)
		if i < stale {
			at = now.Add(-time.Hour)
		}
		return bson.D{{Key: "processingAt", Value: at}, {Key: "attempts", Value: 1}, {Key: "workerId", Value: "w"}, {Key: "claimToken", Value: "t"}}
	})
	if _, err := store.Collection().InsertMany(ctx, docs); err != nil {
		t.Fatalf("insert: %v", err)
	}

	calls := []struct {
		name string
		run  func(ctx context.Context) error
	}{
		{"Stats", func(ctx context.Context) error { _, err := store.Stats(ctx, now.Add(-time.Minute)); return err }},
		{"Held", func(ctx context.Context) error {
			h, err := store.Held(ctx, now, true)
			// The FAILED events hold their aggregates too, but only the
			// backing-off holders have events waiting behind them.
			if err == nil && (h.Aggregates != holders || h.Capped) {
				return fmt.Errorf("held = %+v, want %d aggregates, not capped", h, holders)
			}
			return err
		}},
		{"RecoverStale", func(ctx context.Context) error {
			_, _, err := store.RecoverStale(ctx, now.Add(-time.Minute), now, 5)
			return err
		}},
		{"DeletePublished", func(ctx context.Context) error {
			_, err := store.DeletePublished(ctx, now.Add(-7*24*time.Hour), 1000)
			return err
		}},
		// The console's reads: pages of events (the second one from the
		// first's mark), the FAILED events to group, the held aggregates'
		// holders and the last hour's publish rate.
		{"ListEvents", func(ctx context.Context) error {
			_, mark, err := store.ListEvents(ctx, mongo.EventQuery{Status: events.StatusPublished, Limit: 50})
			if err != nil || mark == nil {
				return fmt.Errorf("first page: mark %v, %w", mark, err)
			}
			_, _, err = store.ListEvents(ctx, mongo.EventQuery{Status: events.StatusPublished, Limit: 50, After: mark})
			return err
		}},
		{"FailedSample", func(ctx context.Context) error { _, _, err := store.FailedSample(ctx, 10); return err }},
		// The console's incident pages and its actions' selection: a rare
		// type or one aggregate within the PUBLISHED history, the FAILED
		// events not classified yet, a failure group's page and
		// selection, one event, the audit.
		{"ListEvents by type", func(ctx context.Context) error {
			_, _, err := store.ListEvents(ctx, mongo.EventQuery{Status: events.StatusPublished, Type: "rare.type", Limit: 50})
			return err
		}},
		{"ListEvents by aggregate", func(ctx context.Context) error {
			_, _, err := store.ListEvents(ctx, mongo.EventQuery{Status: events.StatusNew, AggregateID: "o-3", Limit: 50})
			return err
		}},
		{"ClassifyFailed", func(ctx context.Context) error { _, err := store.ClassifyFailed(ctx, 5000); return err }},
		{"ListEvents of a failure group", func(ctx context.Context) error {
			_, _, err := store.ListEvents(ctx, mongo.EventQuery{Status: events.StatusFailed, Group: &mongo.Group{}, Limit: 50})
			return err
		}},
		{"Select", func(ctx context.Context) error {
			_, _, err := store.Select(ctx, mongo.Selection{Group: &mongo.Group{}}, 1000)
			return err
		}},
		{"Find", func(ctx context.Context) error { _, err := store.Find(ctx, "FAILED-3"); return err }},
		{"Actions", func(ctx context.Context) error {
			for i := range 300 {
				if err := store.RecordAction(ctx, mongo.Action{At: now.Add(time.Duration(i) * time.Second), By: "ana", Name: "requeue", Count: 1}); err != nil {
					return err
				}
			}
			_, err := store.Actions(ctx, 200)
			return err
		}},
		{"Holders", func(ctx context.Context) error { _, _, err := store.Holders(ctx, now, true, 100); return err }},
		{"PublishedPerMinute", func(ctx context.Context) error {
			_, err := store.PublishedPerMinute(ctx, now.Add(-59*time.Minute), now)
			return err
		}},
	}
	if err := store.EnsureBrowseIndex(ctx); err != nil {
		t.Fatalf("EnsureBrowseIndex: %v", err)
	}
	// Each call runs, then the commands it sent are explained. The writes
	// have happened by then (recovery reset its stale events, retention
	// deleted its old history), so their explains see less to examine:
	// their bounds still hold, and their plans are what is checked.
	for _, c := range calls {
		rec.Take()
		callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := c.run(callCtx)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for _, sent := range rec.Take() {
			switch sent.Name {
			case "find", "aggregate", "count", "update", "delete":
			default:
				continue
			}
			coll, _ := sent.Command.Lookup(sent.Name).StringValueOK()
			if coll == store.Collection().Name()+mongo.AuditSuffix && sent.Name == "find" {
				explainAuditRead(ctx, t, db, sent)
				continue
			}
			if coll != store.Collection().Name() {
				continue // the paused types: a few documents of their own collection
			}
			explainPeriodic(ctx, t, db, c.name, sent, perStatus, skipped)
		}
	}
}

// explainPeriodic explains one command a periodic call sent and checks its
// plan and cost (see periodicExplainScenario).
func explainPeriodic(ctx context.Context, t *testing.T, db *driver.Database, call string, sent mongotest.Sent,
	perStatus map[events.Status]int, skipped int) {
	t.Helper()
	cmd, out := explainSent(ctx, t, db, call, sent)
	stages := map[string]bool{}
	planStages(out, stages)
	if stages["COLLSCAN"] {
		t.Errorf("%s: %s %v scans the collection (stages %v)", call, sent.Name, cmd, stages)
	}
	st, ok := executionStats(out)
	if !ok {
		t.Fatalf("%s: explain of %s has no executionStats: %s", call, sent.Name, out)
	}
	// Everything the command is about has one status: it may cost that
	// status's events (and a key past the end of its range), never the
	// collection.
	status := statusOf(sent.Command)
	bound := perStatus[status] + 1
	if sent.Name == "count" { // estimatedDocumentCount: the collection's metadata
		bound = 0
	}
	if st.KeysExamined > bound || st.DocsExamined > bound {
		t.Errorf("%s: %s on %s examined %d keys and %d documents, want at most the %d events of that status (+1)",
			call, sent.Name, status, st.KeysExamined, st.DocsExamined, perStatus[status])
	}
	if sent.Name == "find" {
		if limit := st.Returned + skipped + 1; st.KeysExamined > limit || st.DocsExamined > limit {
			t.Errorf("%s: find %v examined %d keys and %d documents to return %d; want at most %d more (the skipped FAILED events)",
				call, cmd, st.KeysExamined, st.DocsExamined, st.Returned, skipped+1)
		}
	}
	if sent.Name != "count" && !stages["IXSCAN"] && !stages["COUNT_SCAN"] && !stages["IDHACK"] && !stages["EXPRESS_IXSCAN"] {
		t.Errorf("%s: %s %v uses no index (stages %v)", call, sent.Name, cmd, stages)
	}
}

// explainSent explains a command as it was sent, without the fields of
// its session and transport.
func explainSent(ctx context.Context, t *testing.T, db *driver.Database, call string, sent mongotest.Sent) (bson.D, bson.Raw) {
	t.Helper()
	var cmd bson.D
	for _, e := range mustElements(t, sent.Command) {
		switch e.Key() {
		case "lsid", "$clusterTime", "$db", "txnNumber", "$readPreference", "readConcern", "writeConcern", "maxTimeMS",
			"apiVersion", "apiStrict", "apiDeprecationErrors":
		default:
			cmd = append(cmd, bson.E{Key: e.Key(), Value: e.Value()})
		}
	}
	var out bson.Raw
	explain := bson.D{{Key: "explain", Value: cmd}, {Key: "verbosity", Value: "executionStats"}}
	if err := db.RunCommand(ctx, explain).Decode(&out); err != nil {
		t.Fatalf("%s: explain %s %v: %v", call, sent.Name, cmd, err)
	}
	return cmd, out
}

// explainAuditRead checks the audit page's read: the last actions from
// the audit's index, not a sort of the collection.
func explainAuditRead(ctx context.Context, t *testing.T, db *driver.Database, sent mongotest.Sent) {
	t.Helper()
	cmd, out := explainSent(ctx, t, db, "Actions", sent)
	stages := map[string]bool{}
	planStages(out, stages)
	st, ok := executionStats(out)
	if !ok || stages["SORT"] || stages["COLLSCAN"] || !stages["IXSCAN"] || st.DocsExamined > st.Returned {
		t.Errorf("Actions: find %v reads the audit with stages %v, examining %d documents to return %d; want its index, no sort",
			cmd, stages, st.DocsExamined, st.Returned)
	}
}

// explainStats is the part of an explain's executionStats the scenario
// reads.
type explainStats struct {
	Returned, KeysExamined, DocsExamined int
}

// executionStats finds the first executionStats in an explain: at the top
// for a find or a write, under the first stage's $cursor for an aggregate
// that the classic engine runs.
func executionStats(doc bson.Raw) (explainStats, bool) {
	if v, err := doc.LookupErr("executionStats"); err == nil {
		if d, ok := v.DocumentOK(); ok {
			n := func(key string) int {
				i, _ := d.Lookup(key).AsInt64OK()
				return int(i)
			}
			return explainStats{Returned: n("nReturned"), KeysExamined: n("totalKeysExamined"), DocsExamined: n("totalDocsExamined")}, true
		}
	}
	els, _ := doc.Elements()
	for _, e := range els {
		for _, sub := range subDocuments(e.Value()) {
			if st, ok := executionStats(sub); ok {
				return st, true
			}
		}
	}
	return explainStats{}, false
}

// planStages collects every stage name anywhere in an explain, in the
// classic engine's plans and in slot-based ones alike.
func planStages(doc bson.Raw, into map[string]bool) {
	els, _ := doc.Elements()
	for _, e := range els {
		if e.Key() == "stage" {
			if name, ok := e.Value().StringValueOK(); ok {
				into[name] = true
			}
		}
		for _, sub := range subDocuments(e.Value()) {
			planStages(sub, into)
		}
	}
}

// subDocuments is v itself when a document, or the documents of v when an
// array.
func subDocuments(v bson.RawValue) []bson.Raw {
	if d, ok := v.DocumentOK(); ok {
		return []bson.Raw{d}
	}
	a, ok := v.ArrayOK()
	if !ok {
		return nil
	}
	vals, _ := a.Values()
	var out []bson.Raw
	for _, v := range vals {
		if d, ok := v.DocumentOK(); ok {
			out = append(out, d)
		}
	}
	return out
}

// statusOf is the status equality of a periodic command: in a find's
// filter, an aggregate's first $match, or a write's first statement's q.
func statusOf(cmd bson.Raw) events.Status {
	var filter bson.RawValue
	switch {
	case cmd.Lookup("filter").Type != 0:
		filter = cmd.Lookup("filter")
	case cmd.Lookup("pipeline").Type != 0:
		filter = cmd.Lookup("pipeline", "0", "$match")
	case cmd.Lookup("updates").Type != 0:
		filter = cmd.Lookup("updates", "0", "q")
	case cmd.Lookup("deletes").Type != 0:
		filter = cmd.Lookup("deletes", "0", "q")
	default:
		return ""
	}
	d, ok := filter.DocumentOK()
	if !ok {
		return ""
	}
	status, _ := d.Lookup("status").StringValueOK()
	return events.Status(status)
}
