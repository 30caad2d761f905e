package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"
)

func TestNewLoggerAutoIsJSONOffATerminal(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	newLogger(Config{LogFormat: "auto", LogLevel: slog.LevelInfo, WorkerID: "w-1"}, &buf).Info("hello", "n", 1)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("auto to a buffer is not JSON: %v: %s", err, buf.String())
	}
	if rec["msg"] != "hello" || rec["worker_id"] != "w-1" {
		t.Errorf("record = %v", rec)
	}
	// /dev/null is a character device but not a terminal.
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	if isTerminal(devNull) {
		t.Error("isTerminal(/dev/null) = true")
	}
}

func TestNewLoggerText(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	newLogger(Config{LogFormat: "text", LogLevel: slog.LevelInfo}, &buf).Info("hello")
	if !strings.Contains(buf.String(), "msg=hello") {
		t.Errorf("text log = %q", buf.String())
	}
}

func TestShortTime(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 15, 4, 5, 678e6, time.UTC)
	got := shortTime(nil, slog.Time(slog.TimeKey, at))
	if got.Value.String() != "15:04:05.678" {
		t.Errorf("shortTime = %q", got.Value.String())
	}
	other := slog.Time("deadline", at)
	if shortTime(nil, other).Value.Kind() != slog.KindTime {
		t.Error("shortTime changed an attribute other than the record's time")
	}
}
