package main

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fill turns two scrapes into rates: commands by name and in all, the
// claims that read an outbox, and the RSS per outbox.
func TestFleetIdleRunFill(t *testing.T) {
	t.Parallel()
	before := map[string]float64{
		`outbox_db_commands_total{command="find"}`:   100,
		`outbox_db_commands_total{command="insert"}`: 10,
		`outbox_claim_runs_total{result="idle"}`:     5,
		`outbox_claim_runs_total{result="paused"}`:   1,
	}
	after := map[string]float64{
		`outbox_db_commands_total{command="find"}`:   160,
		`outbox_db_commands_total{command="insert"}`: 10,
		`outbox_db_commands_total{command="hello"}`:  6,
		`outbox_claim_runs_total{result="idle"}`:     17,
		`outbox_claim_runs_total{result="claimed"}`:  3,
		`outbox_claim_runs_total{result="paused"}`:   4,
	}
	var run FleetIdleRun
	run.fill(before, after, time.Minute, 80, 40)
	want := FleetIdleRun{
		CommandsS: 1.1, CommandsPerBoxS: 0.028, ByCommand: map[string]float64{"find": 1, "hello": 0.1},
		ClaimReadsS: 0.25, RSSMB: 80, RSSPerBoxMB: 2,
	}
	if diff := cmp.Diff(want, run); diff != "" {
		t.Errorf("fill (-want +got):\n%s", diff)
	}
}
