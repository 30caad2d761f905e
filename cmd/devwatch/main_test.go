package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestPublishedTotal(t *testing.T) {
	t.Parallel()
	got, err := publishedTotal([]byte("# HELP outbox_events_published_total x\n# TYPE outbox_events_published_total counter\noutbox_events_published_total 412\noutbox_events_published_totally 1\n"))
	if err != nil || got != 412 {
		t.Errorf("publishedTotal = %v, %v; want 412", got, err)
	}
	// A worker of several outboxes exports a sample per outbox.
	fleet := "outbox_events_published_total{outbox=\"a\"} 400\noutbox_events_published_total{outbox=\"b\"} 12\n"
	if got, err := publishedTotal([]byte(fleet)); err != nil || got != 412 {
		t.Errorf("publishedTotal of two outboxes = %v, %v; want their sum, 412", got, err)
	}
	if _, err := publishedTotal([]byte("go_goroutines 7\n")); err == nil {
		t.Error("publishedTotal without the counter: no error")
	}
}

func TestLastTotals(t *testing.T) {
	t.Parallel()
	log := `{"msg":"consuming"}
{"msg":"messages processed","processed":10,"processed_total":100,"duplicates_skipped_total":2}
{"msg":"messages processed","processed":5,"processed_total":105,"duplicates_skipped_total":3}
{"msg":"something else"}
{"truncated`
	if got, want := lastTotals([]byte(log)), "105 processed, 3 duplicates skipped"; got != want {
		t.Errorf("lastTotals = %q, want %q", got, want)
	}
	if got := lastTotals([]byte(`{"msg":"consuming"}`)); got != "waiting for its first report" {
		t.Errorf("lastTotals before a report = %q", got)
	}
}

// A line from two workers, one of them down: the rate from the second
// reading on, the backlog from the one that answers, "?" for the other.
func TestLine(t *testing.T) {
	t.Parallel()
	var published atomic.Int64
	published.Store(100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			_, _ = w.Write([]byte("outbox_events_published_total " + strconv.FormatInt(published.Load(), 10) + "\n"))
		case "/status":
			_, _ = w.Write([]byte(`{"counts":{"NEW":3,"PROCESSING":1,"PUBLISHED":50,"FAILED":0},"oldestNewAgeSeconds":0.4}`))
		}
	}))
	defer srv.Close()
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	w := &watcher{workers: []string{down.URL, srv.URL}, client: srv.Client()}
	at := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	first := w.line(context.Background(), at)
	published.Store(140)
	second := w.line(context.Background(), at.Add(2*time.Second))
	for _, want := range []string{"10:00:00", "published -/s", "NEW 3, PROCESSING 1, FAILED 0 (oldest 0.4s)", " ?", " 100"} {
		if !strings.Contains(first, want) {
			t.Errorf("first line %q lacks %q", first, want)
		}
	}
	if !strings.Contains(second, "published 20.0/s") {
		t.Errorf("second line %q lacks the rate 20.0/s", second)
	}
}
