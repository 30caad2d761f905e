package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/redact"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/internal/workerproc"
)

// friendlyScenario: a worker given only a 10 s stale threshold (its publish
// timeout derived) and a broker list whose first node is down relays a
// backlog; /status names the second node and how claims are woken, and the
// log says once whether change streams are used.
func friendlyScenario(t *testing.T, s stack, n int) {
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout(n))
	defer cancel()
	db, coll, exchange, r := s.relayed(t)
	ids := insertBacklog(ctx, t, coll, n, "e2e.friendly")

	dead := testenv.ClosedPortURL(t, s.amqpURL)
	env := map[string]string{
		"OUTBOX_MONGO_URI":      s.mongoURI,
		"OUTBOX_MONGO_DATABASE": db.Name(),
		"OUTBOX_AMQP_URL":       dead + "," + s.amqpURL,
		"OUTBOX_AMQP_EXCHANGE":  exchange,
		"OUTBOX_STALE_AFTER":    "10s",
		// With a 10 s stale threshold, recovery at its 2-minute default
		// would leave what a timed-out claim write landed PROCESSING for
		// up to two periods while claims are slow: longer than this test.
		"OUTBOX_RECOVERY_SCHEDULE": "@every 5s",
		"OUTBOX_HTTP_ADDR":         "127.0.0.1:0",
		"OUTBOX_WORKER_ID":         db.Name() + "-friendly",
	}
	p := startWorker(t, "friendly", env)
	explained(t, coll, func() { r.waitIDs(ctx, t, ids) })
	waitCount(ctx, t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusPublished}}, int64(n))

	var status struct {
		BrokerNode *string `json:"brokerNode"`
		WakeUp     string  `json:"wakeUp"`
	}
	getStatus(ctx, t, p, &status)
	if status.BrokerNode == nil || *status.BrokerNode != redact.URL(s.amqpURL) {
		t.Errorf("/status brokerNode = %v, want the second node %q", status.BrokerNode, redact.URL(s.amqpURL))
	}
	wantWake := "polling"
	if s.atomicClaims {
		wantWake = "change stream"
	}
	if status.WakeUp != wantWake {
		t.Errorf("/status wakeUp = %q, want %q", status.WakeUp, wantWake)
	}
	stopWorkers(t, p)
	r.drain(t)
	r.checkExactly(t, ids)

	log := readLog(t, p)
	if strings.Contains(log, "guest:guest") {
		t.Error("a password reached the log")
	}
	if !s.atomicClaims {
		if c := strings.Count(log, "change streams are not supported"); c != 1 {
			t.Errorf("the polling fallback was logged %d times, want once", c)
		}
	}
	if !strings.Contains(log, `"publish_timeout":"5s"`) {
		t.Errorf("the start-up line does not give the derived publish timeout 5s")
	}
}

func readLog(t *testing.T, p *workerproc.Proc) string {
	t.Helper()
	b, err := os.ReadFile(p.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// httpAddr is the address the worker's "http server listening" or
// "worker running" line gives.
func httpAddr(t *testing.T, p *workerproc.Proc) string {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(readLog(t, p)))
	for sc.Scan() {
		var rec struct {
			Msg      string `json:"msg"`
			HTTPAddr string `json:"http_addr"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) == nil && (rec.Msg == "worker running" || rec.Msg == "http server listening") && rec.HTTPAddr != "" {
			return rec.HTTPAddr
		}
	}
	return ""
}

// getStatus decodes the worker's /status into v.
func getStatus(ctx context.Context, t *testing.T, p *workerproc.Proc, v any) {
	t.Helper()
	var addr string
	testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
		addr = httpAddr(t, p)
		return addr != "", `no "worker running" line in the log`
	})
	_, body, err := httpGet(ctx, "http://"+addr+"/status")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatal(err)
	}
}
