package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// report prints the table and writes bench.json, bench.txt and bench.png,
// and the table into -doc's document when it is set.
func (b *bench) report() error {
	if err := writeReport(b.res, b.cfg.OutDir, b.out); err != nil {
		return err
	}
	if b.cfg.Doc == "" {
		return nil
	}
	return writeDocTable(b.cfg.Doc, b.res)
}

// replot rewrites the table and chart of an earlier run from its JSON,
// and, when doc is set, the table in that document (see writeDocTable).
func replot(path, doc string, out io.Writer) error {
	r, err := loadResults(path)
	if err != nil {
		return err
	}
	if err := writeReport(r, filepath.Dir(path), out); err != nil {
		return err
	}
	if doc == "" {
		return nil
	}
	return writeDocTable(doc, r)
}

// loadResults reads a run's bench.json and evaluates its targets.
func loadResults(path string) (*Results, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Results
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r.evaluate()
	return &r, nil
}

// The markers around the table a document shows of a run: what lies
// between them is generated (writeDocTable), and a test checks that
// docs/performance.md's is the one of results/bench.json.
const (
	docTableBegin = "<!-- bench table: generated from results/bench.json by make bench-doc; do not edit -->"
	docTableEnd   = "<!-- end of bench table -->"
)

// docTable is the Markdown table of r, without the heading and footer
// lines of the terminal's report.
func docTable(r *Results) string {
	var b strings.Builder
	for _, line := range strings.Split(r.table(), "\n") {
		if strings.HasPrefix(line, "|") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// docTableIn returns what lies between the markers in doc, and where.
func docTableIn(doc string) (table string, begin, end int, err error) {
	b := strings.Index(doc, docTableBegin)
	e := strings.Index(doc, docTableEnd)
	if b < 0 || e < b {
		return "", 0, 0, fmt.Errorf("no %q ... %q markers", docTableBegin, docTableEnd)
	}
	begin = b + len(docTableBegin) + 1 // and its newline
	return doc[begin:e], begin, e, nil
}

// writeDocTable replaces the table between the markers in the document
// at path with r's.
func writeDocTable(path string, r *Results) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	doc := string(data)
	_, begin, end, err := docTableIn(doc)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, []byte(doc[:begin]+docTable(r)+doc[end:]), 0o644)
}

func writeReport(r *Results, dir string, out io.Writer) error {
	table := r.table()
	fmt.Fprintln(out)
	fmt.Fprint(out, table)

	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"bench.json": append(js, '\n'),
		"bench.txt":  []byte(table),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	png := filepath.Join(dir, "bench.png")
	if err := writeChart(png, r); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	fmt.Fprintf(out, "\nwrote %s, %s and %s\n", filepath.Join(dir, "bench.json"), filepath.Join(dir, "bench.txt"), png)
	return nil
}

// row is one line of the table.
type row struct{ measure, result, target, status string }

// table renders the run as a Markdown table with a heading, which reads
// the same in a terminal and in docs/performance.md.
func (r *Results) table() string {
	var rows []row
	add := func(measure, result, target string) {
		rows = append(rows, row{measure, result, "", ""})
		if target == "" {
			return
		}
		if t, ok := r.target(target); ok {
			rows[len(rows)-1].target = t.Want
			rows[len(rows)-1].status = map[bool]string{true: "met", false: "NOT MET"}[t.Met]
		}
	}
	c := r.Config
	// A run of some stages (-only) leaves the others' figures at zero:
	// their rows are left out.
	if r.RawBroker.Count > 0 {
		add(fmt.Sprintf("Raw broker limit (own amqp091 publisher, %d B, %s confirms in flight)", rawBodySize, thousands(rawInFlight)),
			fmt.Sprintf("%s msg/s (%s in %.1f s)", thousands(int(r.RawBroker.PerSecond)), thousands(r.RawBroker.Count), r.RawBroker.Seconds), "")
	}
	if r.RawDB.Count > 0 {
		add(fmt.Sprintf("Raw database limit (own loop: find %d NEW ids, claim UpdateMany, mark UpdateMany)", c.BatchSize),
			fmt.Sprintf("%s events/s (%s in %.1f s)", thousands(int(r.RawDB.PerSecond)), thousands(r.RawDB.Count), r.RawDB.Seconds), "")
	}
	for _, d := range r.Drains {
		result := fmt.Sprintf("%s events/s (%s in %.1f s), %.0f%% of the lower raw limit",
			thousands(int(d.PerSecond)), thousands(d.Events), d.Seconds, 100*d.RatioToLimit)
		if d.Duplicates > 0 {
			result += fmt.Sprintf("; %s duplicate deliveries", thousands(d.Duplicates))
		}
		target := targetReplica1
		if d.Replicas > 1 {
			target = targetScaleRate(d.Replicas)
			if one, ok := r.drain(1); ok && one.PerSecond > 0 {
				result += fmt.Sprintf("; %.2fx the 1-replica rate", ratio(d.PerSecond, one.PerSecond))
			}
		}
		add(fmt.Sprintf("Worker, %d replica%s, end to end (bin/worker, %s%s)", d.Replicas, plural(d.Replicas), d.Schedule, prefixed(", OUTBOX_ORDERING=", d.Ordering)), result, target)
	}
	for _, d := range r.UnorderedDrains {
		result := fmt.Sprintf("%s events/s (%s in %.1f s), %.0f%% of the lower raw limit; %s duplicate deliveries",
			thousands(int(d.PerSecond)), thousands(d.Events), d.Seconds, 100*d.RatioToLimit, thousands(d.Duplicates))
		if o, ok := r.drain(d.Replicas); ok && d.PerSecond > 0 {
			result += fmt.Sprintf("; ordered run %.0f%% of this", 100*ratio(o.PerSecond, d.PerSecond))
		}
		add(fmt.Sprintf("Worker, %d replica%s, end to end, ordering off (bin/worker, %s, OUTBOX_ORDERING=%s)", d.Replicas, plural(d.Replicas), d.Schedule, d.Ordering), result, "")
	}
	if h := r.HotAggregate; h != nil {
		for _, run := range []HotRun{h.Ordered, h.Unordered} {
			result := fmt.Sprintf("%s events/s (%s of %s in %.1f s); %s inversions, %s duplicate deliveries; %.1f database commands per 1,000 events",
				thousands(int(run.PerSecond)), thousands(run.Received), thousands(h.Events), run.Seconds,
				thousands(run.Inversions), thousands(run.Duplicates), run.DBCommandsPer1000)
			if run.Ordering == orderingAggregate && h.Ratio > 0 {
				result += fmt.Sprintf("; %.0f%% of the unordered rate", 100*h.Ratio)
			}
			target := ""
			if run.Ordering == orderingAggregate {
				target = targetHotOrder
			}
			add(fmt.Sprintf("Hot aggregate: %s events of one aggregate, 1 worker, OUTBOX_ORDERING=%s", thousands(h.Events), run.Ordering), result, target)
		}
	}
	if rt := r.Retention; rt != nil {
		result := fmt.Sprintf("%s events/s (%s of %s in %.1f s, %d deletes)",
			thousands(int(rt.PerSecond)), thousands(rt.Deleted), thousands(rt.History), rt.Seconds, rt.Batches)
		if d, ok := r.drain(1); ok {
			result += fmt.Sprintf(", %.0f%% of the 1-replica relay's %s events/s", 100*ratio(rt.PerSecond, d.PerSecond), thousands(int(d.PerSecond)))
		}
		add(fmt.Sprintf("Retention delete rate (retention.Cleaner at its defaults: %s, batches of %s; history older than the retention period)",
			rt.Schedule, thousands(rt.BatchSize)), result, targetRetain)
	}
	for _, d := range r.Drains {
		target, result := targetCommands, fmt.Sprintf("%.1f %s", d.DBCommandsPer1000, topCommands(d.DBCommands, 4))
		if d.Replicas > 1 {
			target = targetScaleCommands(d.Replicas)
			if one, ok := r.drain(1); ok && one.DBCommandsPer1000 > 0 {
				result += fmt.Sprintf("; %.2fx the 1-replica figure", ratio(d.DBCommandsPer1000, one.DBCommandsPer1000))
			}
		}
		add(fmt.Sprintf("Database commands per 1,000 events, %d replica%s (batch %d%s)", d.Replicas, plural(d.Replicas), c.BatchSize, prefixed(", OUTBOX_ORDERING=", d.Ordering)),
			result, target)
	}
	for _, d := range r.UnorderedDrains {
		add(fmt.Sprintf("Database commands per 1,000 events, %d replica%s, ordering off (batch %d, OUTBOX_ORDERING=%s)", d.Replicas, plural(d.Replicas), c.BatchSize, d.Ordering),
			fmt.Sprintf("%.1f %s", d.DBCommandsPer1000, topCommands(d.DBCommands, 4)), "")
	}
	if r.PublishStage.Count > 0 {
		add(fmt.Sprintf("Publish stage (broker.Publisher, batches of %d events)", c.BatchSize),
			fmt.Sprintf("%s events/s, %.0f%% of the raw broker limit", thousands(int(r.PublishStage.PerSecond)), 100*ratio(r.PublishStage.PerSecond, r.RawBroker.PerSecond)),
			targetPublish)
	}
	for _, l := range r.Latency {
		target := ""
		if l.Schedule == "@every 100ms" && l.WakeUp != wakeOff {
			target = targetP99
		}
		wake := ""
		switch l.WakeUp {
		case "change stream":
			wake = ", woken on insert"
		case wakeOff:
			wake = ", wake-up on insert off"
		case wakePolling:
			wake = " (wake-up on insert not supported here: polling)"
		}
		add(fmt.Sprintf("Latency createdAt to receipt, %g events/s for %g s, 1 worker at %s%s", l.Rate, l.Seconds, l.Schedule, wake),
			fmt.Sprintf("p50 %.0f, p90 %.0f, p99 %.0f, max %.0f ms (%d of %d received)", l.P50ms, l.P90ms, l.P99ms, l.MaxMs, l.Received, l.Sent),
			target)
	}
	for _, d := range r.Drains {
		target := ""
		if d.Replicas == 1 {
			target = targetCPU
		}
		result := fmt.Sprintf("%.1f ms (%.2f s in all)", d.CPUMsPer1000, d.CPUSeconds)
		if r.RawBrokerCPUMsPer1000 > 0 {
			result += fmt.Sprintf(", %.1fx the raw publisher's", d.CPUMsPer1000/r.RawBrokerCPUMsPer1000)
		}
		add(fmt.Sprintf("Worker CPU per 1,000 events, %d replica%s drain (user+sys, rusage)", d.Replicas, plural(d.Replicas)),
			result, target)
	}
	if r.RawBrokerCPUMsPer1000 > 0 {
		add("Raw publisher CPU per 1,000 messages (the harness's own, rusage): this host's floor for a confirmed publish",
			fmt.Sprintf("%.1f ms", r.RawBrokerCPUMsPer1000), "")
	}
	if rss := r.peakRSS(); rss > 0 {
		add("Worker peak RSS (largest VmHWM of every drain and latency worker process)", fmt.Sprintf("%.1f MB", rss), targetRSS)
	}
	if len(r.SamplerStats) > 0 {
		var parts []string
		for _, st := range r.SamplerStats {
			parts = append(parts, fmt.Sprintf("%.2f s on %s %s", st.Seconds, thousands(st.Events), st.Backlog))
		}
		add("The worker's backlog sampler query (mongo.Store.Stats, every 15 s on the leader)", strings.Join(parts, ", "), "")
	}
	if cl := r.Claim; cl.New > 0 {
		add(fmt.Sprintf("Claim latency, store.Claim of %d on %s NEW, no history", cl.BatchSize, thousands(cl.New)),
			fmt.Sprintf("median %.0f ms of %d", cl.EmptyMs, len(cl.EmptyRunsMs)), "")
		add(fmt.Sprintf("Claim latency, same with %s PUBLISHED events (inserted in %.0f s)", thousands(cl.Published), cl.InsertSeconds),
			fmt.Sprintf("median %.0f ms of %d, %.2fx", cl.WithHistoryMs, len(cl.WithHistoryRunMs), cl.Ratio), targetClaim)
	}
	if cb := r.ClaimBackoff; cb != nil {
		for i, x := range []struct {
			name string
			cost ClaimCost
		}{{"no events backing off", cb.Without}, {fmt.Sprintf("%s NEW events backing off (retryAt +1 h) at the head", thousands(cb.BackingOff)), cb.With}} {
			result := fmt.Sprintf("median %.0f ms of %d, %.1f commands per claim, docs examined %s",
				x.cost.MedianMs, len(x.cost.RunsMs), x.cost.Commands, examined(x.cost.DocsExamined))
			if i == 1 && cb.Ratio > 0 {
				result += fmt.Sprintf(", %.2fx", cb.Ratio)
			}
			add(fmt.Sprintf("Claim latency, store.Claim of %d on %s NEW, %s", cb.BatchSize, thousands(cb.New), x.name), result, "")
		}
	}
	r.heldRows(add)
	r.largeRows(add)
	r.slowRows(add)
	for _, in := range r.Inbox {
		result := fmt.Sprintf("%.0f msg/s", in.PerSecond)
		if in.CommandsPer > 0 {
			result += fmt.Sprintf(", %.2f database commands per message (%s)", in.CommandsPer, in.Commands)
		}
		add(fmt.Sprintf("Consumer: %s (transactions: %t)", in.Name, in.Transactions), result, "")
	}

	var sb strings.Builder
	m := r.Machine
	fmt.Fprintf(&sb, "Outbox relay benchmark, %s\n", r.StartedAt.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&sb, "%d CPUs (%s), %s MB RAM, %s, %s; %s%s; RabbitMQ %s\n",
		m.CPUs, m.CPUModel, thousands(m.MemoryMB), m.Kernel, m.GoVersion, m.Database, prefixed(", ", m.PostgreSQL), m.RabbitMQ)
	fmt.Fprintf(&sb, "Backlog %s events, batch size %d; drain runs use OUTBOX_CLAIM_SCHEDULE=%s.",
		thousands(c.Backlog), c.BatchSize, c.DrainSchedule)
	if len(c.WorkerEnv) > 0 {
		fmt.Fprintf(&sb, " Worker environment: %s.", strings.Join(c.WorkerEnv, " "))
	}
	sb.WriteString("\n\n")
	sb.WriteString("| Measure | Result | Target | Status |\n|---|---|---|---|\n")
	for _, rw := range rows {
		fmt.Fprintf(&sb, "| %s | %s | %s | %s |\n", rw.measure, rw.result, escape(rw.target), rw.status)
	}
	met := 0
	for _, t := range r.Targets {
		if t.Met {
			met++
		}
	}
	fmt.Fprintf(&sb, "\nTargets met: %d of %d.\n", met, len(r.Targets))
	sb.WriteString("Stage durations:")
	for i, s := range r.Stages {
		sep := ","
		if i == 0 {
			sep = ""
		}
		fmt.Fprintf(&sb, "%s %s %.0f s", sep, s.Name, s.Seconds)
	}
	fmt.Fprintf(&sb, "; total %.0f s.\n", r.TotalSeconds)
	return sb.String()
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func prefixed(prefix, s string) string {
	if s == "" {
		return ""
	}
	return prefix + s
}

// escape keeps a target such as "<= 20" readable in Markdown.
func escape(s string) string {
	return strings.NewReplacer("<=", "≤", ">=", "≥").Replace(s)
}

// thousands formats n with comma separators.
func thousands(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
