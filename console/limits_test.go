package console_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/mongo"
)

// TestActionsAreRateLimited: an operator who starts more actions in a
// minute than allowed is refused, and nothing more is done.
func TestActionsAreRateLimited(t *testing.T) {
	t.Parallel()
	const anaToken, boToken = "ana-token-0123456789", "bo-token-0123456789"
	srv, store := serveConfig(t, console.Config{Users: map[string]string{"ana": digest(anaToken), "bo": digest(boToken)}, ActionsPerMinute: 2}, true)
	for i, want := range []int{http.StatusSeeOther, http.StatusSeeOther, http.StatusTooManyRequests} {
		if code, _, _ := request(t, srv, http.MethodPost, "/events/evil-1/requeue", "ana", anaToken, url.Values{"reason": {"x"}}, nil); code != want {
			t.Errorf("action %d = %d, want %d", i+1, code, want)
		}
	}
	if len(store.requeues) != 2 || len(store.actions) != 2 {
		t.Errorf("%d requeues, %d records; want the 2 allowed", len(store.requeues), len(store.actions))
	}
	if code, _, _ := request(t, srv, http.MethodPost, "/events/evil-1/requeue", "bo", boToken, url.Values{"reason": {"x"}}, nil); code != http.StatusSeeOther {
		t.Errorf("another operator's action = %d, want 303: the limit is per operator", code)
	}
}

// TestFailedSignInsAreLimited: past the failed sign-ins allowed from an
// address, even the right token is refused until the minute ends; a
// first request without credentials is no failed sign-in.
func TestFailedSignInsAreLimited(t *testing.T) {
	t.Parallel()
	srv, _ := serveConfig(t, console.Config{Token: token, SignInFailuresPerMinute: 3}, false)
	for range 5 {
		if code, _, _ := request(t, srv, http.MethodGet, "/", "", "", nil, nil); code != http.StatusUnauthorized {
			t.Fatalf("a request without credentials = %d, want 401", code)
		}
	}
	for i := range 3 {
		if code, _, _ := request(t, srv, http.MethodGet, "/", "ana", "guess-guess-guess-"+string(rune('a'+i)), nil, nil); code != http.StatusUnauthorized {
			t.Errorf("wrong token %d = %d, want 401", i+1, code)
		}
	}
	if code, _, _ := request(t, srv, http.MethodGet, "/", "ana", token, nil, nil); code != http.StatusTooManyRequests {
		t.Errorf("the right token after 3 failures = %d, want 429", code)
	}
}

// stuck is a Writer whose requeue waits for its context's end.
type stuck struct{ *fakeStore }

func (s stuck) Requeue(ctx context.Context, _ mongo.RequeueFilter, _ bool) (int, error) {
	<-ctx.Done()
	return 0, ctx.Err()
}

// TestActionsHaveADeadline: an action still running at ActionTimeout
// stops, and its record says it failed for it.
func TestActionsHaveADeadline(t *testing.T) {
	t.Parallel()
	store := newFakeStore(t)
	srv, _ := serveConfig(t, console.Config{Token: token, ActionTimeout: time.Second, Writer: stuck{store}}, false)
	// serveConfig's store is not the Writer here: read the records from
	// the stuck one.
	code, body, _ := request(t, srv, http.MethodPost, "/events/evil-1/requeue", "ana", token, url.Values{"reason": {"x"}}, nil)
	if code == http.StatusSeeOther || !strings.Contains(body, "ActionTimeout") {
		t.Errorf("a requeue past its deadline = %d, want an error naming ActionTimeout: %s", code, body)
	}
	if a := store.actions; len(a) != 1 || a[0].State != mongo.ActionFailed || !strings.Contains(a[0].Error, "ActionTimeout") {
		t.Errorf("audit = %+v, want the requeue failed on its deadline", a)
	}
}

// halfDone is a Writer whose requeue changes the first 3 events it is
// given (stamped with the action), says so, then fails.
type halfDone struct{ *fakeStore }

func (h halfDone) Requeue(_ context.Context, f mongo.RequeueFilter, _ bool) (int, error) {
	h.mu.Lock()
	h.stamp(f.Action, f.Selected[:3])
	h.mu.Unlock()
	f.Progress(3)
	return 3, errors.New("requeue events (3 done): connection reset")
}

// TestPartialFailureIsAudited: an action that fails half way is recorded
// with what it did and why it stopped, and the operator is told both.
func TestPartialFailureIsAudited(t *testing.T) {
	t.Parallel()
	store := newFakeStore(t)
	store.matching = 5
	srv, _ := serveConfig(t, console.Config{Token: token, Writer: halfDone{store}}, false)
	_, page, _ := request(t, srv, http.MethodGet, "/requeue?cause=x&reason=", "ana", token, nil, nil)
	code, body, _ := request(t, srv, http.MethodPost, "/requeue", "ana", token, url.Values{"preview": {previewIn(t, page)}, "reason": {"x"}}, nil)
	if code == http.StatusSeeOther || !strings.Contains(body, "connection reset") {
		t.Errorf("a requeue that failed half way = %d, want the error shown: %s", code, body)
	}
	if a := store.actions; len(a) != 1 || a[0].State != mongo.ActionFailed || a[0].Count != 3 || a[0].Planned != 5 || !strings.Contains(a[0].Error, "connection reset") {
		t.Errorf("audit = %+v, want failed with the 3 of 5 done and why", a)
	}
}
