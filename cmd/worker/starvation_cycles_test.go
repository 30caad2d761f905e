package main

import "testing"

// TestClaimCyclesIn: the starvation scenarios count a replica's claim
// cycles from its /metrics, whatever other labels the series carry. When
// the fleet labelled every series with its outbox, a parser that expected
// result alone counted nothing, and the scenarios waited out their whole
// bound instead of counting cycles.
func TestClaimCyclesIn(t *testing.T) {
	body := []byte(`# HELP outbox_claim_runs_total Claim runs by outcome.
# TYPE outbox_claim_runs_total counter
outbox_claim_runs_total{outbox="default",result="claimed"} 7
outbox_claim_runs_total{outbox="default",result="error"} 3
outbox_claim_runs_total{outbox="default",result="idle"} 5
outbox_claim_runs_total{outbox="default",result="paused"} 2
outbox_claim_runs_total{outbox="default",result="unowned"} 1
outbox_claim_runs_total{result="idle"} 1
outbox_claim_runs_total_other{result="idle"} 100
`)
	got, err := claimCyclesIn(body)
	if err != nil {
		t.Fatal(err)
	}
	if got != 13 {
		t.Errorf("claimCyclesIn = %d, want 13 (claimed 7 + idle 5 + idle 1; not error, paused, unowned, nor another metric)", got)
	}
}
