package otlpsink

import (
	"strings"
	"testing"
	"time"
)

// TestWaterfall: the trace's spans in tree order, children under their
// parent by start time, the pause between the producer's service and the
// next one as a row of its own, names escaped, other traces left out.
func TestWaterfall(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 26, 9, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	svc := func(name string) map[string]string { return map[string]string{"service.name": name} }
	spans := []Span{
		{TraceID: "t1", SpanID: "c", ParentSpanID: "p", Name: "process <order.created>", Kind: "consumer", Start: at(320), End: at(330), Resource: svc("payments")},
		{TraceID: "t1", SpanID: "p", ParentSpanID: "r", Name: "publish events", Kind: "producer", Start: at(300), End: at(310), Resource: svc("outbox-worker")},
		{TraceID: "t1", SpanID: "i", ParentSpanID: "r", Name: "insert events", Kind: "client", Start: at(10), End: at(90), Resource: svc("checkout")},
		{TraceID: "t1", SpanID: "r", Name: "POST /orders", Kind: "server", Start: at(0), End: at(100), Resource: svc("checkout")},
		{TraceID: "t2", SpanID: "x", Name: "another trace", Start: at(0), End: at(1000), Resource: svc("checkout")},
	}
	var b strings.Builder
	if err := Waterfall(&b, spans, "t1", "a trace"); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	order := []string{"POST /orders", "insert events", "waited in the outbox", "publish events", "process &lt;order.created&gt;"}
	last := -1
	for _, name := range order {
		i := strings.Index(svg, ">"+name)
		if i < 0 || i < last {
			t.Fatalf("row %q missing or out of order (want %q):\n%s", name, order, svg)
		}
		last = i
	}
	if !strings.Contains(svg, ">200.0 ms<") {
		t.Errorf("the wait from 100 ms to 300 ms is not labelled 200.0 ms:\n%s", svg)
	}
	if strings.Contains(svg, "another trace") {
		t.Error("a span of another trace was drawn")
	}
	if err := Waterfall(&b, spans, "t9", "none"); err == nil {
		t.Error("Waterfall of a trace with no span: no error")
	}
}
