package ops_test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outbox/broker"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ops"
)

func TestHealthzIgnoresDependencies(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	// Liveness must not depend on the database or the broker: a worker
	// waiting for them is alive, and restarting it would not help.
	s.store.setPingErr(errors.New("connection refused"))
	s.broker.set(events.ErrUnavailable)

	code, body := getJSON(t, s.base+"/healthz")
	if code != http.StatusOK {
		t.Errorf("GET /healthz = %d, want 200", code)
	}
	if body["workerId"] != "host-a-42" {
		t.Errorf("GET /healthz workerId = %v, want host-a-42", body["workerId"])
	}
}

func TestReadyz(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		pingErr    error
		brokerErr  error
		wantCode   int
		wantReason string // prefix; empty when ready
	}{
		{name: "both up", wantCode: http.StatusOK},
		{name: "database down", pingErr: errors.New("server selection timeout"), wantCode: http.StatusServiceUnavailable, wantReason: "mongodb: server selection timeout"},
		{name: "broker down", brokerErr: fmt.Errorf("%w: not connected", events.ErrUnavailable), wantCode: http.StatusServiceUnavailable, wantReason: "rabbitmq: broker unavailable: not connected"},
		{name: "broker blocked", brokerErr: fmt.Errorf("%w: blocked by a broker alarm", events.ErrUnavailable), wantCode: http.StatusServiceUnavailable, wantReason: "rabbitmq: broker unavailable: blocked"},
		{name: "both down", pingErr: errors.New("ping failed"), brokerErr: events.ErrUnavailable, wantCode: http.StatusServiceUnavailable, wantReason: "mongodb: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := startServer(t, nil)
			s.store.setPingErr(tt.pingErr)
			s.broker.set(tt.brokerErr)

			code, body := getJSON(t, s.base+"/readyz")
			if code != tt.wantCode {
				t.Errorf("GET /readyz = %d, want %d (body %v)", code, tt.wantCode, body)
			}
			if body["ready"] != (tt.wantCode == http.StatusOK) {
				t.Errorf("ready = %v, want %t", body["ready"], tt.wantCode == http.StatusOK)
			}
			reason, _ := body["reason"].(string)
			if tt.wantReason == "" && body["reason"] != nil {
				t.Errorf("reason = %v, want none when ready", body["reason"])
			}
			if !strings.HasPrefix(reason, tt.wantReason) {
				t.Errorf("reason = %q, want prefix %q", reason, tt.wantReason)
			}
		})
	}
}

// TestReadyzFollowsSwitch flips the fakes on one server: readiness is
// checked on every request, not cached.
func TestReadyzFollowsSwitch(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	steps := []struct {
		pingErr, brokerErr error
		want               int
	}{
		{nil, nil, http.StatusOK},
		{nil, events.ErrUnavailable, http.StatusServiceUnavailable},
		{nil, nil, http.StatusOK},
		{errors.New("down"), nil, http.StatusServiceUnavailable},
		{nil, nil, http.StatusOK},
	}
	for i, st := range steps {
		s.store.setPingErr(st.pingErr)
		s.broker.set(st.brokerErr)
		if code, _ := do(t, http.MethodGet, s.base+"/readyz"); code != st.want {
			t.Errorf("step %d: GET /readyz = %d, want %d", i, code, st.want)
		}
	}
}

// TestReadyzDuringBrokerOutage puts a real Publisher behind a proxy and
// cuts it: /readyz turns 503 naming rabbitmq, and 200 after Restore.
func TestReadyzDuringBrokerOutage(t *testing.T) {
	t.Parallel()
	amqpURL := testenv.AMQPURL(t)
	exchange := testenv.UniqueName(t, "ex_")
	// Registered first, so it runs after the publisher has stopped.
	t.Cleanup(func() { deleteExchange(t, amqpURL, exchange) })
	proxied, proxy := testenv.Proxied(t, amqpURL)
	pub, err := broker.New(broker.Config{
		URL: proxied, Exchange: exchange, Logger: discard,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, pub)
	s := startServer(t, func(cfg *ops.ServerConfig) { cfg.Outboxes[0].Broker = pub })
	cutAndRestore(t, s, proxy, "rabbitmq: ")
}

// TestReadyzDuringDatabaseOutage puts a real store behind a proxy and cuts
// it: /readyz turns 503 naming mongodb, and 200 after Restore.
func TestReadyzDuringDatabaseOutage(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t) // direct: created here, dropped at cleanup
	client, proxy := testenv.ProxiedClient(t)
	store := mongo.New(client, mongo.Config{Database: db.Name(), Logger: discard})
	s := startServer(t, func(cfg *ops.ServerConfig) { cfg.Outboxes[0].Store = store })
	cutAndRestore(t, s, proxy, "mongodb: ")
}

// cutAndRestore checks /readyz through an outage of the link proxy
// carries: 200 before, 503 with a reason starting with prefix during,
// and 200 again after Restore.
func cutAndRestore(t *testing.T, s *server, proxy *testenv.Proxy, prefix string) {
	t.Helper()
	waitReadyz(t, s, "before the cut", http.StatusOK)
	proxy.Cut()
	body := waitReadyz(t, s, "during the cut", http.StatusServiceUnavailable)
	if reason, _ := body["reason"].(string); !strings.HasPrefix(reason, prefix) || body["ready"] != false {
		t.Errorf("/readyz during the cut = %v, want ready false and a reason starting with %q", body, prefix)
	}
	restored := time.Now()
	proxy.Restore()
	waitReadyz(t, s, "after Restore", http.StatusOK)
	t.Logf("/readyz 200 again %s after Restore", time.Since(restored).Round(time.Millisecond))
}

// waitReadyz polls /readyz until it answers want, and returns its body.
func waitReadyz(t *testing.T, s *server, what string, want int) map[string]any {
	t.Helper()
	var body map[string]any
	testenv.Eventually(t, waitTimeout, func() (bool, string) {
		var code int
		code, body = getJSON(t, s.base+"/readyz")
		return code == want, fmt.Sprintf("%s: GET /readyz = %d %v, want %d", what, code, body, want)
	})
	return body
}

func deleteExchange(t *testing.T, amqpURL, exchange string) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Errorf("delete exchange %s: %v", exchange, err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Errorf("delete exchange %s: %v", exchange, err)
		return
	}
	if err := ch.ExchangeDelete(exchange, false, false); err != nil {
		t.Errorf("delete exchange %s: %v", exchange, err)
	}
}
