package main

import (
	"io"
	"log/slog"
	"os"

	"golang.org/x/term"
)

// newLogger builds the logger every line of which carries the worker id:
// JSON for a log collector, or, on a terminal (OUTBOX_LOG_FORMAT auto) or
// when asked for (text), one key=value line per record, which a person
// reads more easily. On a terminal the time is shortened to the time of
// day: the person watching knows the date.
func newLogger(cfg Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	format := cfg.LogFormat
	if format == "auto" || format == "" {
		format = "json"
		if isTerminal(w) {
			format = "terminal"
		}
	}
	var h slog.Handler
	switch format {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "terminal":
		opts.ReplaceAttr = shortTime
		h = slog.NewTextHandler(w, opts)
	default:
		h = slog.NewJSONHandler(w, opts)
	}
	logger := slog.New(h)
	if cfg.WorkerID != "" {
		logger = logger.With("worker_id", cfg.WorkerID)
	}
	return logger
}

// shortTime writes a record's time as the time of day, to the millisecond.
func shortTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey && a.Value.Kind() == slog.KindTime {
		return slog.String(slog.TimeKey, a.Value.Time().Format("15:04:05.000"))
	}
	return a
}

// isTerminal reports whether w is a terminal, where a person rather than a
// log collector reads the log. A character device is not enough: /dev/null
// is one.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
