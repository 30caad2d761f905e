package wake_test

import (
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/wake"
)

// Watchers of collections in two databases share one stream per
// database: an insert wakes its own collection's watcher only (MongoDB),
// and where change streams are refused the refusal is met, and logged,
// once per database, not once per collection (FerretDB).
func TestStreamsOnePerDatabase(t *testing.T) {
	t.Parallel()
	var logs testenv.LogBuffer
	streams := wake.NewStreams(wake.StreamsConfig{
		BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	dbs := []string{testenv.UniqueName(t, "a_"), testenv.UniqueName(t, "b_")}
	client := testenv.Client(t)
	var watchers []*wake.Watcher
	triggers := make([]atomic.Int32, 6)
	for i := range triggers {
		coll := client.Database(dbs[i%2]).Collection(fmt.Sprintf("outbox_%d", i))
		w, err := wake.New(wake.Config{Collection: coll, Trigger: func() { triggers[i].Add(1) }, Streams: streams,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		testenv.Start(t, w)
		watchers = append(watchers, w)
	}
	t.Cleanup(func() {
		for _, name := range dbs {
			_ = client.Database(name).Drop(t.Context())
		}
	})
	for i, w := range watchers {
		waitFor(t, fmt.Sprintf("watcher %d's stream opened or refused", i), func() bool { return w.Mode() != wake.ModeStarting })
	}
	if testenv.IsFerretDB() {
		if n := strings.Count(logs.String(), "change streams are not supported"); n != len(dbs) {
			t.Errorf("the refusal was logged %d times for %d watchers in %d databases, want once per database; log:\n%s",
				n, len(watchers), len(dbs), logs.String())
		}
		return
	}
	// A reopen from now (no resume token) wakes every watcher of its
	// database: only what follows the insert counts.
	before := make([]int32, len(triggers))
	for i := range triggers {
		before[i] = triggers[i].Load()
	}
	// Collection 3 is in the second database.
	if _, err := client.Database(dbs[1]).Collection("outbox_3").InsertOne(t.Context(), bson.D{
		{Key: events.FieldType, Value: "order.created"}, {Key: events.FieldStatus, Value: events.StatusNew},
		{Key: events.FieldCreatedAt, Value: time.Now()},
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a trigger of outbox_3's watcher", func() bool { return triggers[3].Load() > before[3] })
	for i := range triggers {
		if n := triggers[i].Load() - before[i]; i != 3 && n != 0 {
			t.Errorf("watcher of outbox_%d triggered %d times by an insert into outbox_3", i, n)
		}
	}
}
