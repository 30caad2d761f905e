package main

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxrelay/outbox/claim"
)

func TestBatchBytesFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		limit int64
		want  int
	}{
		{0, claim.BatchBytesDefault},                       // no limit: the default
		{1 << 30, claim.BatchBytesDefault},                 // plenty: no more than the default
		{256 << 20, int((256<<20*8/10 - memBaseline) / 5)}, // the shipped manifest's limit
		{64 << 20, int((64<<20*8/10 - memBaseline) / 5)},
		{32 << 20, minBatchBytes}, // too small for the model: the least bound
	} {
		got := batchBytesFor(tc.limit)
		if got != tc.want {
			t.Errorf("batchBytesFor(%d MiB) = %d, want %d", tc.limit>>20, got, tc.want)
		}
		if tc.limit >= 64<<20 && float64(peakFor(got)) > memBatchShare*float64(tc.limit) {
			t.Errorf("batchBytesFor(%d MiB) = %d: the model's peak %d MiB is over %.0f%% of the limit",
				tc.limit>>20, got, peakFor(got)>>20, memBatchShare*100)
		}
	}
}

// The shipped Deployment and the defaults agree: under the container's
// memory limit, OUTBOX_BATCH_BYTES (auto unless the manifest sets it)
// bounds a batch whose peak, by the memory model, fits the limit; and the
// model covers the peak `make bench` last measured with large documents.
func TestManifestMemoryFitsTheBatch(t *testing.T) {
	t.Parallel()
	objs := kubernetesManifests(t)
	c := one(t, objs, "Deployment").Spec.Template.Spec.Containers[0]
	limit := parseQuantity(t, c.Resources.Limits["memory"])
	batchBytes := batchBytesFor(limit)
	if v := workerEnv(t, objs, c)["OUTBOX_BATCH_BYTES"]; v != "" && v != "auto" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("OUTBOX_BATCH_BYTES %q in the manifest: %v", v, err)
		}
		batchBytes = n
	}
	if peak := peakFor(batchBytes); peak > limit {
		t.Errorf("OUTBOX_BATCH_BYTES %d under a %d MiB limit: the model's peak is %d MiB, over the limit",
			batchBytes, limit>>20, peak>>20)
	}

	raw, err := os.ReadFile("../../results/bench.json")
	if err != nil {
		t.Fatalf("read the bench's results: %v", err)
	}
	var bench struct {
		LargeDocuments struct {
			WorkerEnv string  `json:"workerEnv"`
			PeakRSSMB float64 `json:"peakRssMB"`
		} `json:"largeDocuments"`
	}
	if err := json.Unmarshal(raw, &bench); err != nil {
		t.Fatalf("parse results/bench.json: %v", err)
	}
	measuredAt, err := strconv.Atoi(strings.TrimPrefix(bench.LargeDocuments.WorkerEnv, "OUTBOX_BATCH_BYTES="))
	if err != nil || bench.LargeDocuments.PeakRSSMB == 0 {
		t.Fatalf("results/bench.json's large-document stage has no batch bytes or peak (%+v)", bench.LargeDocuments)
	}
	if measured := int64(bench.LargeDocuments.PeakRSSMB * 1e6); measured > peakFor(measuredAt) {
		t.Errorf("measured peak %.0f MB at OUTBOX_BATCH_BYTES %d is over the model's %d MB: raise memPerBatchByte or memBaseline",
			bench.LargeDocuments.PeakRSSMB, measuredAt, peakFor(measuredAt)/1e6)
	}
}

// parseQuantity reads a Kubernetes memory quantity in Ki, Mi or Gi.
func parseQuantity(t *testing.T, q string) int64 {
	t.Helper()
	for suffix, shift := range map[string]uint{"Ki": 10, "Mi": 20, "Gi": 30} {
		if n, ok := strings.CutSuffix(q, suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			if err != nil {
				t.Fatalf("memory limit %q: %v", q, err)
			}
			return v << shift
		}
	}
	t.Fatalf("memory limit %q: want Ki, Mi or Gi", q)
	return 0
}
