package ops_test

import (
	"encoding/json"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/ops"
)

// TestStatusSampleInDocs checks that the /status sample in
// docs/operations.md shows every field /status returns, so that the
// sample a reader copies from does not lag the endpoint: the fields of
// this package's server with a sample taken, and the fields the worker's
// wiring adds (broker node, wake-up mode, ownership), which a real worker
// returned when the sample was written.
func TestStatusSampleInDocs(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "$ curl -s localhost:8081/status\n")
	if !ok {
		t.Fatal("docs/operations.md has no `$ curl -s localhost:8081/status` sample")
	}
	line, _, _ := strings.Cut(after, "\n")
	var sample map[string]any
	if err := json.Unmarshal([]byte(line), &sample); err != nil {
		t.Fatalf("the /status sample in docs/operations.md is not JSON: %v\n%s", err, line)
	}

	s := startServer(t, nil)
	s.samples.set(&ops.Sample{At: time.Now().UTC(), Stats: events.Stats{Counts: map[events.Status]int64{events.StatusNew: 1}}})
	code, body := getJSON(t, s.base+"/status")
	if code != http.StatusOK {
		t.Fatalf("GET /status = %d, want 200 (body %v)", code, body)
	}
	want := slices.Collect(maps.Keys(body))
	want = append(want, "brokerNode", "wakeUp", "ownership")
	for _, k := range want {
		if _, ok := sample[k]; !ok {
			t.Errorf("the /status sample in docs/operations.md lacks %q", k)
		}
	}
	for k := range sample {
		if !slices.Contains(want, k) {
			t.Errorf("the /status sample in docs/operations.md has %q, which /status does not return", k)
		}
	}
	if counts, _ := sample["counts"].(map[string]any); len(counts) != len(events.CountedStatuses) {
		t.Errorf("the sample's counts %v, want one per status of %v", sample["counts"], events.CountedStatuses)
	}
}
