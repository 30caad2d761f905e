package main

import (
	"log/slog"
	"slices"
	"strings"
	"testing"
)

// A renamed setting's old name is read where the new one is unset, never
// over it, and warned about at start; it is not reported as unknown.
func TestDeprecatedVariables(t *testing.T) {
	t.Parallel()
	renamed := map[string]string{"OUTBOX_OLD_BATCH": "OUTBOX_BATCH_SIZE"}
	env := map[string]string{"OUTBOX_OLD_BATCH": "42"}
	cfg, _, err := loadConfig("run", nil, withDeprecated(envOf(env), renamed), relayCommand, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BatchSize != 42 {
		t.Errorf("BatchSize = %d from the old name, want 42", cfg.BatchSize)
	}
	env["OUTBOX_BATCH_SIZE"] = "7"
	if got := withDeprecated(envOf(env), renamed)("OUTBOX_BATCH_SIZE"); got != "7" {
		t.Errorf("with both names set the worker reads %q, want the new name's 7", got)
	}

	var logs strings.Builder
	rest := warnDeprecated(slog.New(slog.NewTextHandler(&logs, nil)), []string{"OUTBOX_OLD_BATCH=42", "OUTBOX_TYPO=1"}, renamed)
	if !slices.Equal(rest, []string{"OUTBOX_TYPO=1"}) {
		t.Errorf("left for the unknown-variable check: %v, want only OUTBOX_TYPO", rest)
	}
	if !strings.Contains(logs.String(), "deprecated environment variable") || !strings.Contains(logs.String(), "use=OUTBOX_BATCH_SIZE") {
		t.Errorf("no warning naming the new name:\n%s", logs.String())
	}
}
