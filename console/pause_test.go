package console_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// TestPauseAndResumeAType: from the overview, with the token, from the
// console's own page, and with a reason, a type is paused and resumed,
// each recorded with who and why; pausing a paused type records nothing.
func TestPauseAndResumeAType(t *testing.T) {
	t.Parallel()
	srv, store := setupWrites(t)
	pause := func(user string, form url.Values, headers map[string]string) (int, string, http.Header) {
		t.Helper()
		return request(t, srv, http.MethodPost, "/pause", user, token, form, headers)
	}
	if code, body, _ := pause("ana", url.Values{"type": {"order.paid"}}, nil); code != http.StatusBadRequest || !strings.Contains(body, "reason is required") {
		t.Errorf("pause without a reason = %d, want 400 asking for one", code)
	}
	if code, body, _ := pause("ana", url.Values{"reason": {"billing is down"}}, nil); code != http.StatusBadRequest || !strings.Contains(body, "type is required") {
		t.Errorf("pause without a type = %d, want 400 asking for one", code)
	}
	form := url.Values{"type": {"order.paid"}, "reason": {"billing is down"}}
	if code, _, _ := request(t, srv, http.MethodPost, "/pause", "", "", form, nil); code != http.StatusUnauthorized {
		t.Errorf("pause without the token = %d, want 401", code)
	}
	if code, _, _ := pause("ana", form, map[string]string{"Origin": "https://evil.example"}); code != http.StatusForbidden {
		t.Errorf("pause from another site = %d, want 403", code)
	}
	if len(store.paused) != 0 {
		t.Fatalf("paused %v by refused requests", store.paused)
	}
	if code, _, h := pause("ana", form, nil); code != http.StatusSeeOther || h.Get("Location") != "/" {
		t.Errorf("pause = %d to %q, want 303 to the overview", code, h.Get("Location"))
	}
	if code, _, _ := pause("bo", url.Values{"type": {"order.paid"}, "reason": {"again"}}, nil); code != http.StatusSeeOther {
		t.Errorf("a second pause = %d, want 303", code)
	}
	if p := store.paused; len(p) != 1 || p[0].Type != "order.paid" || p[0].By != "ana (shared token)" || p[0].Reason != "billing is down" || !p[0].At.Equal(now) {
		t.Errorf("paused = %+v, want order.paid by ana, now, with the reason", p)
	}
	_, body, _ := request(t, srv, http.MethodGet, "/", "ana", token, nil, nil)
	for _, want := range []string{"Paused event types", "order.paid", "billing is down", `action="/resume"`, `action="/pause"`} {
		if !strings.Contains(body, want) {
			t.Errorf("the overview lacks %q", want)
		}
	}
	if code, _, _ := request(t, srv, http.MethodPost, "/resume", "bo", token, url.Values{"type": {"order.paid"}, "reason": {"billing is back"}}, nil); code != http.StatusSeeOther {
		t.Errorf("resume = %d, want 303", code)
	}
	if len(store.paused) != 0 {
		t.Errorf("still paused after the resume: %v", store.paused)
	}
	got := store.actions
	// Every action is recorded, one that changed nothing with a count of 0.
	if len(got) != 3 || got[2].Name != "pause" || got[2].By != "ana (shared token)" || got[2].Target != "type: order.paid" || got[2].Count != 1 ||
		got[2].Source != "console" || got[1].Count != 0 || got[1].By != "bo (shared token)" || got[0].Name != "resume" || got[0].By != "bo (shared token)" || got[0].Reason != "billing is back" {
		t.Errorf("audit = %+v, want ana's pause, bo's second pause that changed nothing, then bo's resume", got)
	}
}

// TestPauseReadOnly: read-only, the overview offers no pause, names the
// CLI command, and a POST is refused whatever it carries.
func TestPauseReadOnly(t *testing.T) {
	t.Parallel()
	srv, store := setup(t)
	store.paused = []events.Pause{{Type: "order.paid", By: "ana", Reason: "billing is down", At: now}}
	_, body, _ := get(t, srv, "/outbox/")
	if strings.Contains(body, `<form class="action"`) || !strings.Contains(body, "worker pause TYPE") || !strings.Contains(body, "order.paid") {
		t.Errorf("the read-only overview offers a form, or lacks the paused type or the CLI command")
	}
	for _, path := range []string{"/outbox/pause", "/outbox/resume"} {
		if code, _, _ := request(t, srv, http.MethodPost, path, "", "", url.Values{"type": {"order.paid"}, "reason": {"x"}}, nil); code != http.StatusForbidden {
			t.Errorf("POST %s read-only = %d, want 403", path, code)
		}
	}
	if len(store.paused) != 1 {
		t.Errorf("paused = %v after refused requests", store.paused)
	}
}

// TestHeldShowsPausedTypes: the held page names the paused types and
// says which aggregates a paused type holds, and why.
func TestHeldShowsPausedTypes(t *testing.T) {
	t.Parallel()
	srv, store := setup(t)
	store.paused = []events.Pause{{Type: "order.paid", By: "ana", Reason: "billing is down", At: now}}
	doc, err := bson.Marshal(bson.D{
		{Key: "_id", Value: "p-1"}, {Key: "type", Value: "order.paid"}, {Key: "status", Value: "NEW"},
		{Key: "aggregateType", Value: "order"}, {Key: "aggregateId", Value: "o-7"}, {Key: "createdAt", Value: now.Add(-time.Minute)},
	})
	if err != nil {
		t.Fatal(err)
	}
	store.holders = []mongo.Holder{{Key: events.Key("order", "o-7"), Doc: doc}}
	_, body, _ := get(t, srv, "/outbox/held")
	for _, want := range []string{"Paused event types", "order/o-7", "its type order.paid is paused (by ana: billing is down)"} {
		if !strings.Contains(body, want) {
			t.Errorf("the held page lacks %q", want)
		}
	}
	_, body, _ = get(t, srv, "/outbox/api/held")
	var held struct {
		Paused     []events.Pause `json:"pausedTypes"`
		Aggregates []struct {
			Why string `json:"why"`
		} `json:"aggregates"`
	}
	if err := json.Unmarshal([]byte(body), &held); err != nil || len(held.Paused) != 1 || len(held.Aggregates) != 1 || !strings.Contains(held.Aggregates[0].Why, "paused") {
		t.Errorf("/api/held = %s, %v; want the paused type and the aggregate it holds", body, err)
	}
}
