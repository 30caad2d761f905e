package main

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var (
	colLimit   = color.RGBA{150, 150, 150, 255}
	colStage   = color.RGBA{112, 173, 71, 255}
	colWorker  = color.RGBA{46, 117, 182, 255}
	colSlow    = color.RGBA{237, 125, 49, 255}
	colTarget  = color.RGBA{200, 30, 30, 255}
	chartWidth = 30 * vg.Centimeter
)

// writeChart draws three panels side by side: the broker's raw limit next
// to the publish stage, the database's raw limit next to the worker's
// drains (two panels, because the broker is two orders of magnitude
// faster than FerretDB), and the latency percentiles of both schedules
// against the p99 target.
func writeChart(path string, r *Results) error {
	panels := []*plot.Plot{brokerPanel(r), databasePanel(r), latencyPanel(r)}
	img := vgimg.New(chartWidth, 14*vg.Centimeter)
	dc := draw.New(img)
	title := fmt.Sprintf("Outbox relay benchmark %s: %s%s, RabbitMQ %s, %d CPUs, %s",
		r.StartedAt.Format("2006-01-02"), r.Machine.Database, prefixed(", ", r.Machine.PostgreSQL),
		r.Machine.RabbitMQ, r.Machine.CPUs, r.Machine.GoVersion)
	titleStyle := draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, vg.Points(9)),
		XAlign: draw.XCenter, YAlign: draw.YTop, Handler: plot.DefaultTextHandler}
	dc.FillText(titleStyle, vg.Point{X: chartWidth / 2, Y: dc.Max.Y - vg.Points(4)}, title)
	dc.Max.Y -= vg.Points(18)

	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Points(12), PadY: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(6)}
	canvases := plot.Align([][]*plot.Plot{panels}, tiles, dc)
	for i, p := range panels {
		p.Draw(canvases[0][i])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// barPanel is a bar chart of one value per label, each bar in its colour.
func barPanel(title, yLabel string, labels []string, values []float64, cols []color.Color) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = yLabel
	p.Y.Min = 0
	width := vg.Points(28)
	for i, v := range values {
		// One bar chart per bar: each takes its own colour and label
		// slot, the others' slots holding zero.
		vals := make(plotter.Values, len(values))
		vals[i] = v
		b, err := plotter.NewBarChart(vals, width)
		if err != nil {
			continue // a bar chart of finite values cannot fail
		}
		b.Color = cols[i]
		b.LineStyle.Width = 0
		p.Add(b)
	}
	p.NominalX(labels...)
	return p
}

func brokerPanel(r *Results) *plot.Plot {
	return barPanel("Broker (events/s)", "events per second",
		[]string{"raw broker", "publish stage"},
		[]float64{rawBrokerFig.value(r).PerSecond, publishFig.value(r).PerSecond},
		[]color.Color{colLimit, colStage})
}

func databasePanel(r *Results) *plot.Plot {
	labels := []string{"raw DB loop"}
	values := []float64{rawDBFig.value(r).PerSecond}
	cols := []color.Color{colLimit}
	for _, d := range drainsFig.value(r) {
		labels = append(labels, fmt.Sprintf("worker x%d", d.Replicas))
		values = append(values, d.PerSecond)
		cols = append(cols, colWorker)
	}
	p := barPanel(fmt.Sprintf("Database and worker, %s backlog", thousands(r.Config.Backlog)), "events per second", labels, values, cols)
	p.X.Label.Text = "worker drains at " + r.Config.DrainSchedule
	return p
}

// latencyPanel groups p50, p90, p99 and max by schedule, with the p99
// target of the fast schedule as a dashed line.
func latencyPanel(r *Results) *plot.Plot {
	p := plot.New()
	p.Title.Text = "Latency, createdAt to receipt"
	p.Y.Label.Text = "milliseconds"
	p.Y.Min = 0
	p.Legend.Top = true
	width := vg.Points(14)
	cols := []color.Color{colSlow, colWorker}
	latency := latencyFig.value(r)
	for i, l := range latency {
		b, err := plotter.NewBarChart(plotter.Values{l.P50ms, l.P90ms, l.P99ms, l.MaxMs}, width)
		if err != nil {
			continue
		}
		b.Color = cols[i%len(cols)]
		b.LineStyle.Width = 0
		b.Offset = vg.Length(i-len(latency)/2) * width
		p.Add(b)
		p.Legend.Add("1 worker at "+l.Schedule, b)
	}
	target := plotter.NewFunction(func(float64) float64 { return 300 })
	target.Color = colTarget
	target.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(target)
	p.Legend.Add("p99 target at @every 100ms", target)
	p.NominalX("p50", "p90", "p99", "max")
	p.Y.Max = max(p.Y.Max, 330)
	return p
}
