package telemetry

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/internal/fakeclock"
)

// TestErrorHandlerRedactsAndRateLimits: the SDK's errors become warnings
// without the headers' values or URL passwords, and a collector that
// keeps failing costs one line a minute, which says how many it left out.
func TestErrorHandlerRedactsAndRateLimits(t *testing.T) {
	t.Parallel()
	var logs strings.Builder
	clock := fakeclock.New(time.Date(2026, 11, 26, 9, 0, 0, 0, time.UTC))
	h := newErrorHandler(slog.New(slog.NewTextHandler(&logs, nil)), []string{"sekrit-key"}, clock.Now)

	h.Handle(errors.New(`failed to send to http://relay:hunter2@collector:4318/v1/traces: 401 Unauthorized (body: bad api-key "sekrit-key")`))
	h.Handle(errors.New("again"))
	h.logr().Error(errors.New("escape header value"), "parse headers", "value", "sekrit-key")
	first := logs.String()
	if !strings.Contains(first, "level=WARN") || !strings.Contains(first, "http://xxxxx@collector:4318") || !strings.Contains(first, "xxxxx") {
		t.Errorf("first line %q, want a warning with the URL's user and password and the key replaced", first)
	}
	for _, secret := range []string{"hunter2", "sekrit-key"} {
		if strings.Contains(first, secret) {
			t.Errorf("the log shows %q: %s", secret, first)
		}
	}
	if strings.Count(first, "\n") != 1 {
		t.Errorf("%d lines within a minute, want 1:\n%s", strings.Count(first, "\n"), first)
	}

	clock.Advance(errorEvery)
	h.Handle(errors.New("still down"))
	if got := strings.TrimPrefix(logs.String(), first); !strings.Contains(got, "still down") || !strings.Contains(got, "not_logged_since_last=2") {
		t.Errorf("a minute later: %q, want the error and the 2 left out", got)
	}
}
