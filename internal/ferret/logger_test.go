package ferret

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestNewLoggerDropsResponseDumps(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		level    slog.Level
		log      func(*slog.Logger)
		wantLogs bool
	}{
		{"warn response header", slog.LevelWarn, func(l *slog.Logger) { l.Warn("Response header: length: 121") }, false},
		{"warn response body", slog.LevelWarn, func(l *slog.Logger) { l.Warn("Response message:\n{}\n") }, false},
		{"warn proxy response", slog.LevelWarn, func(l *slog.Logger) { l.Warn("Proxy Response message:\n{}\n") }, false},
		{"dump through With", slog.LevelWarn, func(l *slog.Logger) { l.With("name", "conn").Warn("Response header: x") }, false},
		{"error response dump", slog.LevelWarn, func(l *slog.Logger) { l.Error("Response header: length: 121") }, true},
		{"other warning", slog.LevelWarn, func(l *slog.Logger) { l.Warn("Failed to set deadline") }, true},
		{"info below level", slog.LevelWarn, func(l *slog.Logger) { l.Info("Listening") }, false},
		{"debug keeps dumps", slog.LevelDebug, func(l *slog.Logger) { l.Warn("Response header: x") }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			tt.log(NewLogger(&buf, tt.level))
			if got := buf.Len() > 0; got != tt.wantLogs {
				t.Errorf("logged %q, want output: %v", strings.TrimSpace(buf.String()), tt.wantLogs)
			}
		})
	}
}
