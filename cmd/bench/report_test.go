package main

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// The table of docs/performance.md is the one results/bench.json gives:
// figures are stated once, by the run that measured them.
func TestPerformanceDocTableIsTheRunsTable(t *testing.T) {
	t.Parallel()
	r, err := loadResults("../../results/bench.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/performance.md")
	if err != nil {
		t.Fatal(err)
	}
	got, _, _, err := docTableIn(string(doc))
	if err != nil {
		t.Fatalf("docs/performance.md: %v", err)
	}
	if want := docTable(r); got != want {
		t.Errorf("docs/performance.md's table differs from results/bench.json's; run make bench-doc.\ngot:\n%s\nwant:\n%s", got, want)
	}
}

func TestWriteDocTableReplacesOnlyTheTable(t *testing.T) {
	t.Parallel()
	r, err := loadResults("../../results/bench.json")
	if err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/doc.md"
	before := "# Title\n\nText.\n\n" + docTableBegin + "\n| old | table |\n" + docTableEnd + "\n\nAfter.\n"
	if err := os.WriteFile(path, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeDocTable(path, r); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "# Title\n\nText.\n\n" + docTableBegin + "\n" + docTable(r) + docTableEnd + "\n\nAfter.\n"
	if string(data) != want {
		t.Errorf("after writeDocTable:\n%s\nwant:\n%s", data, want)
	}
	if !strings.Contains(docTable(r), "| Measure | Result | Target | Status |") {
		t.Errorf("the table has no heading row:\n%s", docTable(r))
	}
	if err := writeDocTable(t.TempDir()+"/none.md", r); err == nil {
		t.Error("writeDocTable on a missing document: no error")
	}
}

// The table has the rows of the stages in their order, each with its
// target's want and status; a stage the run did not measure has none.
func TestTableRowsFollowTheStages(t *testing.T) {
	t.Parallel()
	stages := []stage{fakeStage("b", false, nil), fakeStage("a", false, nil), fakeStage("unrun", false, nil)}
	var r Results
	a, b := figure[int]{"a"}, figure[int]{"b"}
	a.set(&r, 1)
	b.set(&r, 2)
	r.evaluate(stages)
	want := []row{
		{measure: "fake b", result: "xx", target: ">= 2", status: "met"},
		{measure: "fake a", result: "x", target: ">= 2", status: "NOT MET"},
	}
	if diff := cmp.Diff(want, r.rows(stages), cmp.AllowUnexported(row{})); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	table := r.tableOf(stages)
	for _, line := range []string{"| fake b | xx | ≥ 2 | met |\n| fake a | x | ≥ 2 | NOT MET |\n", "Targets met: 1 of 2."} {
		if !strings.Contains(table, line) {
			t.Errorf("the table has no %q:\n%s", line, table)
		}
	}
}

// A row whose target was not evaluated (its reference not measured) has
// neither want nor status.
func TestTableRowWithoutItsTarget(t *testing.T) {
	t.Parallel()
	var r Results
	drainsFig.set(&r, []Drain{{Replicas: 1, PerSecond: 300, Events: 10000}})
	r.evaluate(stages())
	if _, ok := r.target(targetReplica1); ok {
		t.Fatalf("target %q evaluated without a raw database loop", targetReplica1)
	}
	rows := r.rows(stages())
	if len(rows) == 0 || !strings.HasPrefix(rows[0].measure, "Worker, 1 replica") || rows[0].target != "" || rows[0].status != "" {
		t.Errorf("rows %+v: want the drain first, without a target", rows)
	}
}

// The targets of the harness's stages, met and not met, from made-up
// figures.
func TestStageTargets(t *testing.T) {
	t.Parallel()
	type want struct {
		name string
		met  bool
	}
	tests := []struct {
		name  string
		setup func(r *Results)
		want  []want
	}{
		{"one replica at 70% of the raw loop", func(r *Results) {
			rawDBFig.set(r, Rate{Count: 1000, PerSecond: 100})
			drainsFig.set(r, []Drain{{Replicas: 1, PerSecond: 70, DBCommandsPer1000: 20.1, CPUMsPer1000: 40, PeakRSSMB: 99}})
		}, []want{{targetReplica1, true}, {targetCommands, false}, {targetCPU, true}, {targetRSS, true}}},
		{"one replica under 70%, replicas that scale in rate but not commands", func(r *Results) {
			rawDBFig.set(r, Rate{Count: 1000, PerSecond: 100})
			drainsFig.set(r, []Drain{
				{Replicas: 1, PerSecond: 69, DBCommandsPer1000: 10, CPUMsPer1000: 41, PeakRSSMB: 100},
				{Replicas: 2, PerSecond: 63, DBCommandsPer1000: 20},
				{Replicas: 4, PerSecond: 62, DBCommandsPer1000: 20.1},
			})
		}, []want{
			{targetReplica1, false}, {targetScaleRate(2), true}, {targetScaleRate(4), false},
			{targetCommands, true}, {targetScaleCommands(2), true}, {targetScaleCommands(4), false},
			{targetCPU, false}, {targetRSS, false},
		}},
		{"publish stage at 60% of the raw broker", func(r *Results) {
			rawBrokerFig.set(r, Rate{Count: 1, PerSecond: 1000})
			publishFig.set(r, Rate{Count: 1, PerSecond: 600})
		}, []want{{targetPublish, true}}},
		{"claim with history 2x, retention slower than the relay", func(r *Results) {
			drainsFig.set(r, []Drain{{Replicas: 1, PerSecond: 300}})
			retentionFig.set(r, RetentionRate{PerSecond: 299})
			claimFig.set(r, ClaimLatency{New: 1, EmptyMs: 100, WithHistoryMs: 200, Ratio: 2})
		}, []want{{targetClaim, true}, {targetRetain, false}}},
		{"the 50,000-event backlog at 0.7x the raw loop", func(r *Results) {
			slowFig.set(r, []SlowRun{fiftyK(0.7, true)})
		}, []want{{targetSlowDelivered(fiftyK(0, true)), true}, {targetSlowRatio(fiftyK(0, true)), true}}},
		{"the 50,000-event backlog not all delivered", func(r *Results) {
			slowFig.set(r, []SlowRun{fiftyK(0.9, false)})
		}, []want{{targetSlowDelivered(fiftyK(0, true)), false}, {targetSlowRatio(fiftyK(0, true)), false}}},
		{"the 50,000-event backlog at 0.89x a sorted loop whose run asks 0.9x", func(r *Results) {
			run := fiftyK(0.89, true)
			run.RatioMin = 0.9
			slowFig.set(r, []SlowRun{run})
		}, []want{{targetSlowDelivered(fiftyK(0, true)), true}, {targetSlowRatio(fiftyK(0, true)), false}}},
		{"3 replicas at 1.19x one, 4 at 0.9x", func(r *Results) {
			drainsFig.set(r, []Drain{{Replicas: 1, PerSecond: 100}, {Replicas: 3, PerSecond: 119}, {Replicas: 4, PerSecond: 90}})
		}, []want{{targetScaleRate(3), false}, {targetScaleRate(4), true}}},
		{"a starved paused head, a held head that flowed", func(r *Results) {
			starveFig.set(r, []Starvation{
				{Key: "paused-head", Healthy: 400, Runs: []StarveRun{{WorkerBuild: WorkerBuild{Build: buildCurrent}, Healthy: 20}}},
				{Key: "held-head", Healthy: 400, Runs: []StarveRun{{WorkerBuild: WorkerBuild{Build: buildCurrent}, Healthy: 400, AllHealthy: true, HeadChanged: 1}}},
			})
		}, []want{
			{"starvation, paused-head: every healthy event delivered", false}, {"starvation, paused-head: no head event delivered", true},
			{"starvation, held-head: every healthy event delivered", true}, {"starvation, held-head: no head event delivered", false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var r Results
			tt.setup(&r)
			r.evaluate(stages())
			var got []want
			for _, tg := range r.Targets {
				got = append(got, want{tg.Name, tg.Met})
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("targets (-want +got):\n%s", diff)
			}
		})
	}
}

// fiftyK is a run of the 50,000-event stage: the raw loop at 100
// events/s, this build's worker at ratio times that.
func fiftyK(ratio float64, all bool) SlowRun {
	events := 50000
	if !all {
		events = 40000
	}
	return SlowRun{
		Key: "backlog-50k", Name: "backlog of 50,000 events", Backlog: 50000,
		Raw: Rate{Count: 50000, Seconds: 500, PerSecond: 100},
		Workers: []SlowWorker{{
			WorkerBuild: WorkerBuild{Build: buildCurrent}, Events: events, Deliveries: events, AllDelivered: all,
			Seconds: 50000 / (100 * ratio), FirstSeconds: 12, PerSecond: 100 * ratio, Ratio: ratio,
		}},
	}
}

// The 50,000-event stage's rows give the raw loop's rate, the relay's and
// their ratio; they appear only when that stage ran.
func TestBacklog50kRows(t *testing.T) {
	t.Parallel()
	var r Results
	slowFig.set(&r, []SlowRun{fiftyK(0.72, true)})
	r.evaluate(stages())
	rows := r.rows(stages())
	var measures []string
	for _, rw := range rows {
		measures = append(measures, rw.measure)
	}
	want := []string{
		"Slow database, 50,000 events, database direct: raw loop (find 500, claim, mark) through the same path",
		"Slow database, 50,000 events, database direct: 1 worker at its defaults (this build)",
		"Slow database, 50,000 events, database direct: every event delivered (this build)",
	}
	if diff := cmp.Diff(want, measures); diff != "" {
		t.Fatalf("rows (-want +got):\n%s", diff)
	}
	if rows[0].result != "100 events/s (50,000 in 500.0 s)" {
		t.Errorf("raw loop row: %q", rows[0].result)
	}
	if !strings.HasPrefix(rows[1].result, "72 events/s (50,000 of 50,000 in 694.4 s, first after 12.0 s), 0.72x the raw loop") ||
		rows[1].target != ">= 0.7x" || rows[1].status != "met" {
		t.Errorf("worker row: %+v", rows[1])
	}
}

// The sorted raw loop reads through the index whose keys are exactly
// {status: 1, createdAt: 1}, whatever their numeric type.
func TestSameKeys(t *testing.T) {
	t.Parallel()
	want := bson.D{{Key: "status", Value: int32(1)}, {Key: "createdAt", Value: int32(1)}}
	for keys, same := range map[string]bool{
		`{"status": 1, "createdAt": 1}`:                      true,
		`{"status": {"$numberLong": "1"}, "createdAt": 1.0}`: true,
		`{"status": 1, "createdAt": -1}`:                     false,
		`{"createdAt": 1, "status": 1}`:                      false,
		`{"status": 1, "retryAt": 1, "createdAt": 1}`:        false,
		`{"status": 1}`:                                      false,
	} {
		var d bson.D
		if err := bson.UnmarshalExtJSON([]byte(keys), false, &d); err != nil {
			t.Fatal(err)
		}
		if got := sameKeys(d, want); got != same {
			t.Errorf("sameKeys(%s) = %v, want %v", keys, got, same)
		}
	}
}
