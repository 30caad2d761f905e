package rule_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxrelay/outbox/events/internal/rule"
)

func TestFirst(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		rules []*rule.Error
		want  string // the error; "" for none
	}{
		{"none broken", []*rule.Error{rule.Between("N", 5, 1, 10), rule.Required("Name", true)}, ""},
		{"between", []*rule.Error{rule.Between("BatchSize", 0, 1, 10000)}, "claim: BatchSize 0: want 1 to 10000"},
		{"at least", []*rule.Error{rule.AtLeast("RetryMin", time.Duration(0), time.Millisecond)}, "claim: RetryMin 0s: want at least 1ms"},
		{"above", []*rule.Error{rule.Above("StaleAfter", -time.Second, 0)}, "claim: StaleAfter -1s: want more than 0s"},
		{"required", []*rule.Error{rule.Required("WorkerID", false)}, "claim: WorkerID is required"},
		{"one of, quoted", []*rule.Error{rule.OneOf("Ordering", "", "aggregate", "none")}, `claim: Ordering "": want one of aggregate, none`},
		{"check", []*rule.Error{rule.Check("Retention", false, -time.Hour, "0 or more")}, "claim: Retention -1h0m0s: want 0 or more"},
		{"at least a field", []*rule.Error{rule.AtLeastField("RetryMax", time.Second, "RetryMin", time.Minute)},
			"claim: RetryMax 1s: want at least RetryMin (1m0s)"},
		{"above a field", []*rule.Error{rule.AboveField("StaleAfter", time.Minute, "PublishTimeout", time.Minute)},
			"claim: StaleAfter 1m0s: want more than PublishTimeout (1m0s)"},
		{"the first broken one", []*rule.Error{rule.Required("A", true), rule.AtLeast("B", 0, 1), rule.AtLeast("C", 0, 1)},
			"claim: B 0: want at least 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := rule.First("claim", tt.rules...)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("First = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestErrorFields checks what a caller can read from the error: the
// Config, the field, the value and what the field accepts.
func TestErrorFields(t *testing.T) {
	t.Parallel()
	err := rule.First("claim", rule.AtLeastField("RetryMax", time.Second, "RetryMin", time.Minute))
	var got *rule.Error
	if !errors.As(err, &got) {
		t.Fatalf("First = %v, want a *rule.Error", err)
	}
	want := &rule.Error{Config: "claim", Field: "RetryMax", Value: time.Second, Want: "at least RetryMin (1m0s)"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}
}
