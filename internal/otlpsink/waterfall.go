package otlpsink

import (
	"cmp"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Waterfall layout, in SVG user units.
const (
	wfWidth   = 980
	wfLabelW  = 330 // the names' column
	wfRowH    = 30
	wfTop     = 58 // title and axis
	wfBottom  = 40 // legend
	wfBarH    = 18
	wfPadding = 16
)

// serviceColors are the bars' colours, by order of appearance of the
// services in the trace.
var serviceColors = []string{"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2"}

// Waterfall writes an SVG picture of the trace of traceID among spans, as
// a tracing UI draws it: one row per span, indented under its parent, a
// bar from its start to its end on a common time axis, coloured by
// service. Where the trace passes from one service to the next after a
// pause (an event waiting in the outbox), the pause gets a dashed row of
// its own, labelled with how long it was.
func Waterfall(w io.Writer, spans []Span, traceID, title string) error {
	var trace []Span
	for _, s := range spans {
		if s.TraceID == traceID {
			trace = append(trace, s)
		}
	}
	if len(trace) == 0 {
		return fmt.Errorf("no span of trace %s", traceID)
	}
	rows := ordered(trace)
	start, end := rows[0].span.Start, rows[0].span.End
	for _, r := range rows {
		start = minTime(start, r.span.Start)
		end = maxTime(end, r.span.End)
	}
	rows = withWait(rows)
	services := []string{}
	for _, r := range rows {
		if name := r.span.Resource["service.name"]; name != "" && !slices.Contains(services, name) {
			services = append(services, name)
		}
	}
	total := end.Sub(start)
	if total <= 0 {
		total = time.Millisecond
	}
	height := wfTop + len(rows)*wfRowH + wfBottom
	plotW := float64(wfWidth - wfLabelW - wfPadding)
	x := func(t time.Time) float64 {
		return wfLabelW + plotW*float64(t.Sub(start))/float64(total)
	}

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n",
		wfWidth, height, wfWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold" fill="#222">%s</text>`+"\n", wfPadding, esc(title))
	// The axis: a tick every step, labelled in milliseconds from the start.
	step := tickStep(total)
	for t := time.Duration(0); t <= total; t += step {
		tx := x(start.Add(t))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e3e3e3"/>`+"\n", tx, wfTop-8, tx, wfTop+len(rows)*wfRowH)
		label := fmtDuration(t)
		if t == 0 {
			label = "0"
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#666">%s</text>`+"\n", tx, wfTop-12, esc(label))
	}
	for i, r := range rows {
		y := wfTop + i*wfRowH
		if i%2 == 1 {
			fmt.Fprintf(&b, `<rect x="0" y="%d" width="%d" height="%d" fill="#f7f7f7"/>`+"\n", y, wfWidth, wfRowH)
		}
		label := r.span.Name
		if r.span.Kind != "" && r.span.Kind != "internal" && r.span.Kind != "unspecified" {
			label += "  [" + r.span.Kind + "]"
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#222">%s</text>`+"\n", wfPadding+14*r.depth, y+19, esc(label))
		x1, x2 := x(r.span.Start), x(r.span.End)
		width := math.Max(x2-x1, 2)
		by := y + (wfRowH-wfBarH)/2
		if r.wait {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#fbfbfb" stroke="#999" stroke-dasharray="4 3"/>`+"\n", x1, by, width, wfBarH)
		} else {
			color := serviceColors[max(0, slices.Index(services, r.span.Resource["service.name"]))%len(serviceColors)]
			fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" rx="3" fill="%s"/>`+"\n", x1, by, width, wfBarH, color)
			if r.span.StatusError {
				fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" rx="3" fill="none" stroke="#c0392b" stroke-width="2"/>`+"\n", x1, by, width, wfBarH)
			}
		}
		// The duration beside the bar, inside the plot.
		text := fmtDuration(r.span.End.Sub(r.span.Start))
		if x2+70 < wfWidth {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#444">%s</text>`+"\n", x2+5, y+19, esc(text))
		} else {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="end" fill="#444">%s</text>`+"\n", x1-5, y+19, esc(text))
		}
	}
	// The legend: the services and their colours.
	ly := wfTop + len(rows)*wfRowH + 26
	lx := wfPadding
	for i, s := range services {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" rx="2" fill="%s"/>`+"\n", lx, ly-10, serviceColors[i%len(serviceColors)])
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#222">%s</text>`+"\n", lx+17, ly, esc(s))
		lx += 30 + 8*len(s)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// row is one line of the picture: a span and its depth in the tree, or
// the wait between two services.
type row struct {
	span  Span
	depth int
	wait  bool
}

// ordered is the trace's spans as a tree, depth first, children by start
// time; a span whose parent is not in the trace is a root.
func ordered(trace []Span) []row {
	ids := map[string]bool{}
	for _, s := range trace {
		ids[s.SpanID] = true
	}
	children := map[string][]Span{}
	var roots []Span
	for _, s := range trace {
		if s.ParentSpanID == "" || !ids[s.ParentSpanID] {
			roots = append(roots, s)
			continue
		}
		children[s.ParentSpanID] = append(children[s.ParentSpanID], s)
	}
	byStart := func(a, b Span) int { return cmp.Or(a.Start.Compare(b.Start), strings.Compare(a.SpanID, b.SpanID)) }
	var out []row
	var walk func(s Span, depth int)
	walk = func(s Span, depth int) {
		out = append(out, row{span: s, depth: depth})
		kids := children[s.SpanID]
		slices.SortFunc(kids, byStart)
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	slices.SortFunc(roots, byStart)
	for _, r := range roots {
		walk(r, 0)
	}
	return out
}

// withWait inserts, before the first span of a service other than the
// first one, a row for the time between the end of the first service's
// last span before it and its start: the time the event waited in the
// outbox. None when there is no such pause.
func withWait(rows []row) []row {
	first := rows[0].span.Resource["service.name"]
	next := -1
	for i, r := range rows {
		if r.span.Resource["service.name"] != first && (next < 0 || r.span.Start.Before(rows[next].span.Start)) {
			next = i
		}
	}
	if next < 0 {
		return rows
	}
	var waitFrom time.Time
	for _, r := range rows {
		if r.span.Resource["service.name"] == first && !r.span.End.After(rows[next].span.Start) {
			waitFrom = maxTime(waitFrom, r.span.End)
		}
	}
	if waitFrom.IsZero() {
		return rows
	}
	wait := row{wait: true, depth: rows[next].depth, span: Span{
		Name: "waited in the outbox", Start: waitFrom, End: rows[next].span.Start,
	}}
	return slices.Insert(rows, next, wait)
}

// tickStep is a round step that puts 5 to 10 ticks on an axis of total.
func tickStep(total time.Duration) time.Duration {
	step := time.Microsecond
	for total/step > 10 {
		switch {
		case total/(step*2) <= 10:
			return step * 2
		case total/(step*5) <= 10:
			return step * 5
		}
		step *= 10
	}
	return step
}

func fmtDuration(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%d µs", d.Microseconds())
	}
}

func esc(s string) string { return html.EscapeString(s) }

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
