package console_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/service"
)

// slowProgress is a Writer whose requeue reports progress once, and
// whose progress write hangs until its context ends: a database that
// stopped answering half way.
type slowProgress struct{ *fakeStore }

func (s slowProgress) Requeue(_ context.Context, f mongo.RequeueFilter, _ bool) (int, error) {
	f.Progress(1)
	return 1, nil
}

func (s slowProgress) ProgressAction(ctx context.Context, _ bson.ObjectID, _ int) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestActionDeadlineIsHard: an action's request ends within its
// ActionTimeout and the audit's own short bound, whatever its progress
// writes do.
func TestActionDeadlineIsHard(t *testing.T) {
	t.Parallel()
	store := newFakeStore(t)
	c, err := console.New(console.Config{
		Store: store, Samples: samples{}, Writer: slowProgress{store}, Token: token, ActionTimeout: time.Second,
		Archetype: service.Archetype{Logger: quiet},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	start := time.Now()
	// Served straight, not through a test server, whose Close would wait
	// for a request that never ends.
	go func() {
		done <- serve(context.Background(), c, http.MethodPost, "/events/evil-1/requeue", url.Values{"reason": {"x"}}).Code
	}()
	select {
	case <-done:
		if took := time.Since(start); took > 8*time.Second {
			t.Errorf("the action took %s, past its 1s deadline and the audit's bound", took)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the action's request did not end in 15s with ActionTimeout 1s: a progress write holds it")
	}
}

// TestNoAuthAnswersLoopbackOnly: a console mounted with no
// authentication and no AllowedHosts answers to loopback names only, so
// that a page of another site rebound to its address reads nothing.
func TestNoAuthAnswersLoopbackOnly(t *testing.T) {
	t.Parallel()
	srv, _ := serveConfig(t, console.Config{}, false)
	for host, want := range map[string]int{
		"evil.example": http.StatusMisdirectedRequest, "evil.example:8090": http.StatusMisdirectedRequest,
		"localhost:8090": http.StatusOK, "127.0.0.1:8090": http.StatusOK, "[::1]:8090": http.StatusOK,
	} {
		if got := hostRequest(t, srv, "/api/events", host); got != want {
			t.Errorf("GET with Host %s = %d, want %d", host, got, want)
		}
	}
}
