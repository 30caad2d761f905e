package main

import "testing"

// TestWithoutOutbox: the harness reads a worker's samples with or
// without the outbox label, wherever the label sits among the others.
func TestWithoutOutbox(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`outbox_events_published_total{outbox="default"} 5`:                 `outbox_events_published_total 5`,
		`outbox_job_errors_total{job="claim",outbox="default"} 1`:           `outbox_job_errors_total{job="claim"} 1`,
		`outbox_claim_runs_total{outbox="default",result="idle"} 3`:         `outbox_claim_runs_total{result="idle"} 3`,
		`outbox_db_commands_total{command="find"} 9`:                        `outbox_db_commands_total{command="find"} 9`,
		`outbox_sequence_anomalies_total{kind="behind",outbox="default"} 2`: `outbox_sequence_anomalies_total{kind="behind"} 2`,
		`outbox_events_published_total 5`:                                   `outbox_events_published_total 5`,
	} {
		if got := withoutOutbox(in); got != want {
			t.Errorf("withoutOutbox(%s) = %s, want %s", in, got, want)
		}
	}
}
