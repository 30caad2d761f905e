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
	r.evaluate(stages())
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
func (r *Results) table() string { return r.tableOf(stages()) }

// tableOf renders the run with the rows of stages, in their order. A run
// of some stages (-only) has no figures of the others: they add no row.
func (r *Results) tableOf(stages []stage) string {
	var sb strings.Builder
	r.heading(&sb)
	sb.WriteString("| Measure | Result | Target | Status |\n|---|---|---|---|\n")
	for _, rw := range r.rows(stages) {
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

// rows are the table's rows of stages, each with its target's want and
// status when it names an evaluated target.
func (r *Results) rows(stages []stage) []row {
	var rows []row
	add := func(measure, result, target string) {
		rw := row{measure: measure, result: result}
		if t, ok := r.target(target); ok && target != "" {
			rw.target = t.Want
			rw.status = map[bool]string{true: "met", false: "NOT MET"}[t.Met]
		}
		rows = append(rows, rw)
	}
	for _, s := range stages {
		if s.rows != nil {
			s.rows(r, add)
		}
	}
	return rows
}

// heading is the lines above the table: when, where, with what settings.
func (r *Results) heading(sb *strings.Builder) {
	m, c := r.Machine, r.Config
	fmt.Fprintf(sb, "Outbox relay benchmark, %s\n", r.StartedAt.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(sb, "%d CPUs (%s), %s MB RAM, %s, %s; %s%s; RabbitMQ %s\n",
		m.CPUs, m.CPUModel, thousands(m.MemoryMB), m.Kernel, m.GoVersion, m.Database, prefixed(", ", m.PostgreSQL), m.RabbitMQ)
	fmt.Fprintf(sb, "Backlog %s events, batch size %d; drain runs use OUTBOX_CLAIM_SCHEDULE=%s.",
		thousands(c.Backlog), c.BatchSize, c.DrainSchedule)
	if len(c.WorkerEnv) > 0 {
		fmt.Fprintf(sb, " Worker environment: %s.", strings.Join(c.WorkerEnv, " "))
	}
	sb.WriteString("\n\n")
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
