package ops_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/ops"
)

// TestOutboxesReadyAlone: a worker of two outboxes is ready while one of
// them is, names the one that is not, answers for each alone with
// ?outbox=, and is not ready only when neither is.
func TestOutboxesReadyAlone(t *testing.T) {
	t.Parallel()
	downStore := &fakeStore{stats: events.Stats{Counts: map[events.Status]int64{}}}
	billingClaimer := &fakeJob{}
	s := startServer(t, func(c *ops.ServerConfig) {
		c.Outboxes[0].Name = "orders"
		c.Outboxes = append(c.Outboxes, ops.Outbox{
			Name: "billing", Store: downStore, Broker: &switchBroker{}, Samples: &fakeSamples{},
			Claimer: billingClaimer, Recovery: &fakeJob{},
		})
	})
	if code, body := getJSON(t, s.base+"/readyz"); code != http.StatusOK || body["notReady"] != nil {
		t.Errorf("GET /readyz with both up = %d %v, want 200 and nothing not ready", code, body)
	}

	downStore.setPingErr(errors.New("connection refused"))
	code, body := getJSON(t, s.base+"/readyz")
	notReady, _ := body["notReady"].(map[string]any)
	if reason, _ := notReady["billing"].(string); code != http.StatusOK || body["ready"] != true || !strings.HasPrefix(reason, "mongodb: ") || len(notReady) != 1 {
		t.Errorf("GET /readyz with billing's database down = %d %v, want 200 naming billing's database as not ready", code, body)
	}
	if code, body := getJSON(t, s.base+"/readyz?outbox=billing"); code != http.StatusServiceUnavailable || !strings.HasPrefix(body["reason"].(string), "mongodb: ") {
		t.Errorf("GET /readyz?outbox=billing = %d %v, want 503 naming the database", code, body)
	}
	if code, _ := getJSON(t, s.base+"/readyz?outbox=orders"); code != http.StatusOK {
		t.Errorf("GET /readyz?outbox=orders = %d, want 200", code)
	}

	s.store.setPingErr(errors.New("connection refused"))
	code, body = getJSON(t, s.base+"/readyz")
	notReady, _ = body["notReady"].(map[string]any)
	if code != http.StatusServiceUnavailable || body["reason"] != "no outbox is ready" || len(notReady) != 2 {
		t.Errorf("GET /readyz with both databases down = %d %v, want 503, no outbox ready, both named", code, body)
	}
	if code, _ := getJSON(t, s.base+"/readyz?outbox=shipping"); code != http.StatusNotFound {
		t.Errorf("GET /readyz?outbox=shipping (no such outbox) = %d, want 404", code)
	}
}

// TestOutboxesStatusAndTrigger: /status lists each outbox under its name
// (one without a sample says so, the others still answer), ?outbox=
// answers one outbox's body, and POST /trigger wakes every outbox's
// claimer, or the one named.
func TestOutboxesStatusAndTrigger(t *testing.T) {
	t.Parallel()
	billingSamples := &fakeSamples{}
	billingClaimer := &fakeJob{}
	s := startServer(t, func(c *ops.ServerConfig) {
		c.Outboxes[0].Name = "orders"
		c.Outboxes = append(c.Outboxes, ops.Outbox{
			Name: "billing", Store: &fakeStore{}, Broker: &switchBroker{}, Samples: billingSamples,
			Claimer: billingClaimer, Recovery: &fakeJob{},
		})
	})
	s.samples.set(&ops.Sample{At: time.Now(), Stats: events.Stats{Counts: map[events.Status]int64{events.StatusNew: 7}}})

	code, body := getJSON(t, s.base+"/status")
	list, _ := body["outboxes"].([]any)
	if code != http.StatusOK || len(list) != 2 || body["workerId"] != "host-a-42" {
		t.Fatalf("GET /status = %d %v, want 200, the worker id and two outboxes", code, body)
	}
	orders, _ := list[0].(map[string]any)
	billing, _ := list[1].(map[string]any)
	if orders["outbox"] != "orders" || orders["counts"].(map[string]any)["NEW"] != 7.0 {
		t.Errorf("/status outboxes[0] = %v, want orders with its 7 NEW events", orders)
	}
	if billing["outbox"] != "billing" || billing["error"] == nil || billing["counts"] != nil {
		t.Errorf("/status outboxes[1] = %v, want billing with an error and no counts: no sample yet", billing)
	}
	if code, body := getJSON(t, s.base+"/status?outbox=billing"); code != http.StatusServiceUnavailable || body["outbox"] != "billing" {
		t.Errorf("GET /status?outbox=billing = %d %v, want 503 with billing's own state", code, body)
	}
	if code, body := getJSON(t, s.base+"/status?outbox=orders"); code != http.StatusOK || body["outbox"] != "orders" {
		t.Errorf("GET /status?outbox=orders = %d %v, want 200 with orders' body", code, body)
	}

	if code, _ := do(t, http.MethodPost, s.base+"/trigger"); code != http.StatusAccepted {
		t.Errorf("POST /trigger = %d, want 202", code)
	}
	s.claimer.wantTriggered(t, 1, "after POST /trigger")
	billingClaimer.wantTriggered(t, 1, "after POST /trigger")
	if code, _ := do(t, http.MethodPost, s.base+"/trigger?outbox=billing"); code != http.StatusAccepted {
		t.Errorf("POST /trigger?outbox=billing = %d, want 202", code)
	}
	s.claimer.wantTriggered(t, 1, "after POST /trigger?outbox=billing")
	billingClaimer.wantTriggered(t, 2, "after POST /trigger?outbox=billing")
}

// TestNoOutboxYet: a worker that relays no outbox (a fleet whose
// patterns of databases match none yet) serves, is not ready and says
// why, lists no outbox in /status, and takes outboxes once some are found.
func TestNoOutboxYet(t *testing.T) {
	t.Parallel()
	var first ops.Outbox
	_, srv := newServer(t, func(c *ops.ServerConfig) { first, c.Outboxes = c.Outboxes[0], nil })
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(t.Context()) })
	base := "http://" + srv.Addr()
	if code, body := getJSON(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.HasPrefix(body["reason"].(string), "no outbox to relay yet") {
		t.Errorf("GET /readyz with no outbox = %d %v, want 503 saying there is none yet", code, body)
	}
	if code, body := getJSON(t, base+"/status"); code != http.StatusOK || len(body["outboxes"].([]any)) != 0 {
		t.Errorf("GET /status with no outbox = %d %v, want 200 and no outbox", code, body)
	}
	if err := srv.SetOutboxes([]ops.Outbox{first}); err != nil {
		t.Fatal(err)
	}
	if code, body := getJSON(t, base+"/readyz"); code != http.StatusOK {
		t.Errorf("GET /readyz once an outbox is found = %d %v, want 200", code, body)
	}
}
