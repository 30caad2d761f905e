package ferret

import (
	"context"
	"io"
	"log/slog"
	"strings"
)

// NewLogger returns a text logger for FerretDB at level, writing to w.
//
// FerretDB logs the full header and body of every response whose "ok" is 0 at
// Warn level, so each command error a client sees anyway (a duplicate key,
// the driver's unsupported endSessions on disconnect) becomes a dozen lines.
// Below Debug level, NewLogger drops those dumps and keeps every other
// message, including the Error-level dumps of responses that close the
// connection.
func NewLogger(w io.Writer, level slog.Level) *slog.Logger {
	h := slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})
	if level <= slog.LevelDebug {
		return slog.New(h)
	}
	return slog.New(responseDumpFilter{h})
}

// responseDumpFilter drops FerretDB's Warn-level dumps of failed responses.
type responseDumpFilter struct {
	slog.Handler
}

func (f responseDumpFilter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn && isResponseDump(r.Message) {
		return nil
	}
	return f.Handler.Handle(ctx, r)
}

func (f responseDumpFilter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return responseDumpFilter{f.Handler.WithAttrs(attrs)}
}

func (f responseDumpFilter) WithGroup(name string) slog.Handler {
	return responseDumpFilter{f.Handler.WithGroup(name)}
}

// isResponseDump reports whether msg is one of the two records FerretDB's
// connection logs per failed response ("Response header: ...",
// "Response message:\n...", or the same with "Proxy Response").
func isResponseDump(msg string) bool {
	for _, who := range []string{"Response", "Proxy Response"} {
		if strings.HasPrefix(msg, who+" header: ") || strings.HasPrefix(msg, who+" message:\n") {
			return true
		}
	}
	return false
}
