package telemetry

import (
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// errorEvery is the least time between two log lines of the SDK's errors:
// a collector that is down fails every export, one every few seconds.
const errorEvery = time.Minute

// errorHandler logs the OpenTelemetry SDK's errors (a failed export, a
// full queue) and its own log lines as warnings of the worker's logger:
// tracing is an aid, never a reason to stop relaying. A line is written
// with the values of the OTLP headers (API keys) and the users and
// passwords of URLs replaced by xxxxx, and repeated ones at most once per
// errorEvery, with the number left out since the last.
type errorHandler struct {
	logger  *slog.Logger
	secrets []string
	now     func() time.Time

	mu      sync.Mutex
	last    time.Time
	skipped int
}

func newErrorHandler(logger *slog.Logger, secrets []string, now func() time.Time) *errorHandler {
	if now == nil {
		now = time.Now
	}
	return &errorHandler{logger: logger, secrets: secrets, now: now}
}

// Handle is otel.ErrorHandler's method: the SDK calls it with each error.
func (h *errorHandler) Handle(err error) {
	if err != nil {
		h.warn("tracing: spans not exported", err.Error())
	}
}

// warn logs msg with detail, redacted, unless a line went out less than
// errorEvery ago.
func (h *errorHandler) warn(msg, detail string) {
	h.mu.Lock()
	now := h.now()
	if !h.last.IsZero() && now.Sub(h.last) < errorEvery {
		h.skipped++
		h.mu.Unlock()
		return
	}
	skipped := h.skipped
	h.last, h.skipped = now, 0
	h.mu.Unlock()
	attrs := []any{}
	if detail != "" {
		attrs = append(attrs, "error", h.redact(detail))
	}
	if skipped > 0 {
		attrs = append(attrs, "not_logged_since_last", skipped)
	}
	h.logger.Warn(msg, attrs...)
}

// userinfo matches the user and password of a URL in free text.
var userinfo = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s"]*@`)

// redact replaces the headers' values and any URL's user and password.
func (h *errorHandler) redact(s string) string {
	for _, secret := range h.secrets {
		s = strings.ReplaceAll(s, secret, "xxxxx")
	}
	return userinfo.ReplaceAllString(s, "${1}xxxxx@")
}

// logr is the logger the SDK writes its own lines to (otel.SetLogger):
// its errors and warnings (logr verbosity 1) go to warn with their
// message only, since their key-value pairs may hold a header's value;
// its info and debug lines (verbosity 4 and 8) are dropped.
func (h *errorHandler) logr() logr.Logger { return logr.New(sink{h}) }

type sink struct{ h *errorHandler }

func (sink) Init(logr.RuntimeInfo)              {}
func (sink) Enabled(level int) bool             { return level <= 1 }
func (s sink) Info(_ int, msg string, _ ...any) { s.h.warn("tracing: "+msg, "") }
func (s sink) Error(err error, msg string, _ ...any) {
	detail := ""
	if err != nil {
		detail = err.Error()
	}
	s.h.warn("tracing: "+msg, detail)
}
func (s sink) WithValues(...any) logr.LogSink { return s }
func (s sink) WithName(string) logr.LogSink   { return s }
