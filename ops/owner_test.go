package ops_test

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/ops"
)

// fakeOwner is the partition ownership with a switch: how long the
// replica has owned nothing, and the last round's error.
type fakeOwner struct {
	mu      sync.Mutex
	owned   []int
	unowned time.Duration
	err     error
}

func (o *fakeOwner) Owned() []int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.owned
}

func (o *fakeOwner) Unowned() (time.Duration, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.unowned, o.err
}

func (o *fakeOwner) TermLength() time.Duration { return 30 * time.Second }

func (o *fakeOwner) set(owned []int, unowned time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.owned, o.unowned, o.err = owned, unowned, err
}

// A replica whose database and broker answer but that has owned no
// partition for longer than a term relays nothing: it is not ready, and
// /readyz and /status say why. Owning nothing for a term at most (a start,
// a rebalance) is not held against it, nor is it reported before the
// database and the broker are.
func TestReadyzNeedsPartitions(t *testing.T) {
	t.Parallel()
	owner := &fakeOwner{}
	s := startServer(t, func(c *ops.ServerConfig) { c.Outboxes[0].Owner = owner })
	denied := errors.New("heartbeat: write heartbeat: (Unauthorized) not authorized on outbox to execute command { update: \"events_owners\" }")

	for _, tc := range []struct {
		name       string
		owned      []int
		unowned    time.Duration
		err        error
		brokerErr  error
		wantCode   int
		wantReason []string // substrings of the reason
	}{
		{name: "owns partitions", owned: []int{0, 1, 2}, wantCode: http.StatusOK},
		{name: "starting: none yet, within a term", unowned: 10 * time.Second, err: denied, wantCode: http.StatusOK},
		{name: "rounds fail for longer than a term", unowned: 47 * time.Second, err: denied, wantCode: http.StatusServiceUnavailable,
			wantReason: []string{"ownership: no partition owned for 47s, longer than a term (30s)", "can this worker write the owners collection?", "Unauthorized"}},
		{name: "rounds succeed, others hold everything", unowned: time.Minute, wantCode: http.StatusServiceUnavailable,
			wantReason: []string{"ownership: no partition owned for 1m0s", "more replicas than the 64 partitions?"}},
		{name: "the broker first", unowned: time.Minute, err: denied, brokerErr: events.ErrUnavailable, wantCode: http.StatusServiceUnavailable,
			wantReason: []string{"rabbitmq: "}},
	} {
		owner.set(tc.owned, tc.unowned, tc.err)
		s.broker.set(tc.brokerErr)
		code, body := getJSON(t, s.base+"/readyz")
		if code != tc.wantCode {
			t.Errorf("%s: GET /readyz = %d %v, want %d", tc.name, code, body, tc.wantCode)
		}
		reason, _ := body["reason"].(string)
		for _, want := range tc.wantReason {
			if !strings.Contains(reason, want) {
				t.Errorf("%s: reason %q, want it to contain %q", tc.name, reason, want)
			}
		}
		if strings.HasPrefix(reason, "rabbitmq") && strings.Contains(reason, "ownership") {
			t.Errorf("%s: reason %q mixes the broker and the ownership", tc.name, reason)
		}
	}
}

// /status shows the replica's share and, while it has owned nothing for
// longer than a term, why it is not ready; before the first sample too.
func TestStatusOwnership(t *testing.T) {
	t.Parallel()
	owner := &fakeOwner{}
	s := startServer(t, func(c *ops.ServerConfig) { c.Outboxes[0].Owner = owner })
	denied := errors.New("take 64 partitions: insert 64 terms: not authorized")

	owner.set(nil, 95*time.Second, denied)
	code, body := getJSON(t, s.base+"/status")
	if code != http.StatusServiceUnavailable { // no sample yet
		t.Fatalf("GET /status before a sample = %d, want 503 with the worker's own fields", code)
	}
	own, _ := body["ownership"].(map[string]any)
	if own == nil {
		t.Fatalf("/status has no ownership: %v", body)
	}
	if own["partitions"] != 0.0 || own["unownedSeconds"] != 95.0 || own["lastError"] != denied.Error() {
		t.Errorf("/status ownership = %v, want 0 partitions, 95 s unowned and the round's error", own)
	}
	if nr, _ := own["notReady"].(string); !strings.Contains(nr, "no partition owned for 1m35s") {
		t.Errorf("/status ownership.notReady = %q, want why /readyz fails", nr)
	}

	owner.set([]int{3, 4}, 0, nil)
	_, body = getJSON(t, s.base+"/status")
	own, _ = body["ownership"].(map[string]any)
	if own["partitions"] != 2.0 || own["unownedSeconds"] != 0.0 || own["lastError"] != nil || own["notReady"] != nil {
		t.Errorf("/status ownership = %v, want 2 partitions and nothing wrong", own)
	}
}
