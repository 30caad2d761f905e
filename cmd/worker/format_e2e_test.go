package main

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// TestMessageFormatReachesTheRelay runs `worker run` with each
// OUTBOX_MESSAGE_FORMAT and checks the message it publishes: the setting
// is wired through to the claimer, not only accepted (the events package
// tests what each format holds).
func TestMessageFormatReachesTheRelay(t *testing.T) {
	t.Parallel()
	cases := []struct {
		format, source, prefix string
		wantContentType        string
	}{
		{events.FormatPlain, "", "", "application/json"},
		// The source unset: /outbox/<database>/<collection>; the prefix
		// unset: cloudEvents_.
		{events.FormatCloudEventsBinary, "", "", "application/json"},
		{events.FormatCloudEventsBinary, "", "ce-", "application/json"},
		{events.FormatCloudEventsStructured, "https://shop.example/orders", "", "application/cloudevents+json"},
	}
	for _, tc := range cases {
		t.Run(tc.format+tc.prefix, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			s := localStack(t)
			db := uniqueDatabase(t, s.connect(t, 2))
			exchange := testenv.UniqueName(t, "ex_")
			deliveries := testenv.Consume(t, s.amqpURL, exchange)
			workerID := db.Name() + "-w"
			env := s.relayEnv(db.Name(), exchange, workerID)
			env["OUTBOX_MESSAGE_FORMAT"] = tc.format
			if tc.source != "" {
				env["OUTBOX_CLOUDEVENTS_SOURCE"] = tc.source
			}
			prefix := events.PrefixAMQP
			if tc.prefix != "" {
				env["OUTBOX_CLOUDEVENTS_PREFIX"] = tc.prefix
				prefix = tc.prefix
			}
			proc := startWorker(t, workerID, env)
			t.Cleanup(func() { stopWorkers(t, proc) })
			if _, err := events.Insert(ctx, db.Collection(mongo.CollectionDefault), events.Draft{
				ID: "o-7-created", Type: "order.created", AggregateType: "order", AggregateID: "o-7",
				Payload: bson.D{{Key: "total", Value: 7}},
			}); err != nil {
				t.Fatal(err)
			}
			select {
			case d := <-deliveries:
				if d.ContentType != tc.wantContentType {
					t.Errorf("content type %q, want %q", d.ContentType, tc.wantContentType)
				}
				_, hasID := d.Headers[prefix+"id"]
				if want := tc.format == events.FormatCloudEventsBinary; hasID != want {
					t.Errorf("%sid header present = %t, want %t (headers %v)", prefix, hasID, want, d.Headers)
				}
				if tc.format == events.FormatCloudEventsBinary {
					if want := "/outbox/" + db.Name() + "/" + mongo.CollectionDefault; d.Headers[prefix+"source"] != want {
						t.Errorf("%ssource %v, want the default %q", prefix, d.Headers[prefix+"source"], want)
					}
				}
			case <-ctx.Done():
				t.Fatalf("no message within the test's time; worker log:\n%s", proc.Tail(20))
			}
		})
	}
}
