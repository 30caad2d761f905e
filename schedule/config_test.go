package schedule_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/outbox/schedule"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	run := func(context.Context) (bool, error) { return false, nil }
	tests := []struct {
		name string
		cfg  schedule.Config
		want string // in the error; "" for none
	}{
		{"valid", schedule.Config{Name: "claim", Schedule: "@every 1s", Run: run}, ""},
		{"no name", schedule.Config{Schedule: "@every 1s", Run: run}, "schedule: Name is required"},
		{"bad schedule", schedule.Config{Name: "claim", Schedule: "@every 0s", Run: run}, `schedule: Schedule "@every 0s": want a schedule`},
		{"no run", schedule.Config{Name: "claim", Schedule: "@every 1s"}, "schedule: Run is required"},
		{"negative YieldMax", schedule.Config{Name: "claim", Schedule: "@every 1s", Run: run, YieldMax: -time.Second}, "schedule: YieldMax"},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: Validate = %v, want nil", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: Validate = %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
}

func TestRuleNamesTheField(t *testing.T) {
	t.Parallel()
	if e := schedule.Rule("Schedule", "*/2 * * * *"); e != nil {
		t.Errorf("Rule of a valid schedule = %v, want nil", e)
	}
	e := schedule.Rule("RecoverySchedule", "* * *")
	if e == nil || e.Field != "RecoverySchedule" || e.Value != "* * *" || !strings.Contains(e.Want, "5 fields") {
		t.Errorf("Rule(* * *) = %+v, want the field, the spec and cron's reason", e)
	}
}

func TestEvery(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	var runs atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		schedule.Every(ctx, time.Millisecond, func(context.Context) {
			if runs.Add(1) == 3 {
				cancel()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatal("Every did not return after its context ended")
	}
	if n := runs.Load(); n != 3 {
		t.Errorf("%d runs, want 3: none after the context ended", n)
	}
}
