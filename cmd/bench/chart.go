package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Chart geometry and colours.
const (
	chartW, chartH = 1200, 620
	panelTop       = 130
	panelBottom    = chartH - 90
)

var (
	colBackground = color.RGBA{255, 255, 255, 255}
	colAxis       = color.RGBA{40, 40, 40, 255}
	colGrid       = color.RGBA{225, 225, 225, 255}
	colText       = color.RGBA{20, 20, 20, 255}
	colLimit      = color.RGBA{150, 150, 150, 255}
	colWorker     = color.RGBA{46, 117, 182, 255}
	colPublish    = color.RGBA{112, 173, 71, 255}
	colSlow       = color.RGBA{237, 125, 49, 255}
	colFast       = color.RGBA{46, 117, 182, 255}
	colTarget     = color.RGBA{200, 30, 30, 255}
)

// writeChart draws two panels: throughput next to the raw limits (log
// scale, as the broker is two orders of magnitude above FerretDB) and the
// latency percentiles of both schedules.
func writeChart(path string, r *Results) error {
	c := newCanvas(chartW, chartH)
	c.textScaled(chartW/2, 10, "Outbox relay benchmark "+r.StartedAt.Format("2006-01-02"), colText, alignCenter, 1)
	c.text(chartW/2, 52, fmt.Sprintf("%s%s, RabbitMQ %s, %d CPUs, %s; backlog %s events, batch %d",
		r.Machine.Database, prefixed(", ", r.Machine.PostgreSQL), r.Machine.RabbitMQ, r.Machine.CPUs, r.Machine.GoVersion,
		thousands(r.Config.Backlog), r.Config.BatchSize), colText, alignCenter)
	c.throughputPanel(image.Rect(90, panelTop, 640, panelBottom), r)
	c.latencyPanel(image.Rect(760, panelTop, 1170, panelBottom), r)

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, c.img); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

type bar struct {
	label, sub string
	value      float64
	col        color.Color
}

func (c *canvas) throughputPanel(area image.Rectangle, r *Results) {
	bars := []bar{
		{"raw broker", "own publisher", r.RawBroker.PerSecond, colLimit},
		{"publish", "stage", r.PublishStage.PerSecond, colPublish},
		{"raw DB", "own loop", r.RawDB.PerSecond, colLimit},
	}
	for _, d := range r.Drains {
		bars = append(bars, bar{fmt.Sprintf("worker x%d", d.Replicas), "end to end", d.PerSecond, colWorker})
	}
	c.textScaled((area.Min.X+area.Max.X)/2, area.Min.Y-62, "Throughput (log scale)", colText, alignCenter, 1)

	hi := 10.0
	for _, b := range bars {
		for hi < b.value {
			hi *= 10
		}
	}
	lo := 10.0
	y := func(v float64) int {
		v = max(v, lo)
		f := (math.Log10(v) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo))
		return area.Max.Y - int(f*float64(area.Dy()))
	}
	for v := lo; v <= hi; v *= 10 {
		c.hline(area.Min.X, area.Max.X, y(v), colGrid)
		c.text(area.Min.X-6, y(v)+4, compact(v), colText, alignRight)
	}
	c.axes(area)
	c.vtext(area.Min.X-45, (area.Min.Y+area.Max.Y)/2, "events per second", colText)

	slot := area.Dx() / len(bars)
	for i, b := range bars {
		x0 := area.Min.X + i*slot + slot/5
		x1 := area.Min.X + (i+1)*slot - slot/5
		top := y(b.value)
		c.fill(image.Rect(x0, top, x1, area.Max.Y), b.col)
		c.text((x0+x1)/2, top-6, thousands(int(b.value)), colText, alignCenter)
		c.text((x0+x1)/2, area.Max.Y+16, b.label, colText, alignCenter)
		c.text((x0+x1)/2, area.Max.Y+30, b.sub, colText, alignCenter)
	}
	c.text(area.Min.X, area.Min.Y-24, "events per second; grey: raw limits of this run, green: broker.Publisher alone,", colText, alignLeft)
	c.text(area.Min.X, area.Min.Y-10, fmt.Sprintf("blue: bin/worker replicas draining %s events at %s", thousands(r.Config.Backlog), r.Config.DrainSchedule), colText, alignLeft)
}

func (c *canvas) latencyPanel(area image.Rectangle, r *Results) {
	c.textScaled((area.Min.X+area.Max.X)/2, area.Min.Y-62, "Latency, createdAt to receipt", colText, alignCenter, 1)
	names := []string{"p50", "p90", "p99", "max"}
	hi := 300.0 // the p99 target stays in view
	for _, l := range r.Latency {
		hi = max(hi, l.MaxMs)
	}
	step := niceStep(hi / 5)
	hi = math.Ceil(hi/step) * step
	y := func(v float64) int { return area.Max.Y - int(v/hi*float64(area.Dy())) }
	for v := 0.0; v <= hi; v += step {
		c.hline(area.Min.X, area.Max.X, y(v), colGrid)
		c.text(area.Min.X-6, y(v)+4, fmt.Sprintf("%g", v), colText, alignRight)
	}
	c.axes(area)
	c.vtext(area.Min.X-50, (area.Min.Y+area.Max.Y)/2, "milliseconds", colText)

	// The p99 target of the fast schedule.
	for x := area.Min.X; x < area.Max.X; x += 8 {
		c.hline(x, min(x+4, area.Max.X), y(300), colTarget)
	}

	cols := []color.Color{colSlow, colFast}
	group := area.Dx() / len(names)
	n := max(len(r.Latency), 1)
	for gi, name := range names {
		gx := area.Min.X + gi*group + group/8
		bw := (group - group/4) / n
		for li, l := range r.Latency {
			v := []float64{l.P50ms, l.P90ms, l.P99ms, l.MaxMs}[gi]
			x0 := gx + li*bw
			c.fill(image.Rect(x0+2, y(v), x0+bw-2, area.Max.Y), cols[li%len(cols)])
			c.text(x0+bw/2, y(v)-6, fmt.Sprintf("%.0f", v), colText, alignCenter)
		}
		c.text(area.Min.X+gi*group+group/2, area.Max.Y+16, name, colText, alignCenter)
	}
	for li, l := range r.Latency {
		x := area.Min.X + li*210
		c.fill(image.Rect(x, area.Max.Y+40, x+12, area.Max.Y+52), cols[li%len(cols)])
		c.text(x+18, area.Max.Y+51, fmt.Sprintf("1 worker at %s", l.Schedule), colText, alignLeft)
	}
	c.hline(area.Min.X, area.Min.X+12, area.Max.Y+66, colTarget)
	c.text(area.Min.X+18, area.Max.Y+70, "p99 target at @every 100ms: 300 ms", colTarget, alignLeft)
	if len(r.Latency) > 0 {
		c.text(area.Min.X, area.Min.Y-10, fmt.Sprintf("%g events/s for %g s, milliseconds", r.Latency[0].Rate, r.Latency[0].Seconds), colText, alignLeft)
	}
}

// niceStep rounds a grid step up to 1, 2 or 5 times a power of ten.
func niceStep(x float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

// compact writes an axis value: 10, 100, 1k, 10k.
func compact(v float64) string {
	if v >= 1000 && math.Mod(v, 1000) == 0 {
		return fmt.Sprintf("%gk", v/1000)
	}
	return fmt.Sprintf("%g", v)
}

type align int

const (
	alignLeft align = iota
	alignCenter
	alignRight
)

// canvas is an RGBA image with the few drawing operations the chart needs.
type canvas struct{ img *image.RGBA }

func newCanvas(w, h int) *canvas {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), &image.Uniform{colBackground}, image.Point{}, draw.Src)
	return &canvas{img}
}

func (c *canvas) fill(r image.Rectangle, col color.Color) {
	draw.Draw(c.img, r, &image.Uniform{col}, image.Point{}, draw.Src)
}

func (c *canvas) hline(x0, x1, y int, col color.Color) { c.fill(image.Rect(x0, y, x1, y+1), col) }

func (c *canvas) axes(area image.Rectangle) {
	c.fill(image.Rect(area.Min.X-1, area.Min.Y, area.Min.X+1, area.Max.Y+1), colAxis)
	c.fill(image.Rect(area.Min.X-1, area.Max.Y, area.Max.X, area.Max.Y+2), colAxis)
}

// text draws s with its baseline at y.
func (c *canvas) text(x, y int, s string, col color.Color, a align) {
	d := font.Drawer{Dst: c.img, Src: &image.Uniform{col}, Face: basicfont.Face7x13}
	w := d.MeasureString(s).Round()
	switch a {
	case alignCenter:
		x -= w / 2
	case alignRight:
		x -= w
	}
	d.Dot = fixed.P(x, y)
	d.DrawString(s)
}

// textScaled draws s scale+1 times larger, its top at y, for titles.
func (c *canvas) textScaled(x, y int, s string, col color.Color, a align, scale int) {
	k := scale + 1
	face := basicfont.Face7x13
	w := font.MeasureString(face, s).Round()
	tmp := image.NewRGBA(image.Rect(0, 0, w, 13))
	d := font.Drawer{Dst: tmp, Src: &image.Uniform{col}, Face: face, Dot: fixed.P(0, 10)}
	d.DrawString(s)
	switch a {
	case alignCenter:
		x -= w * k / 2
	case alignRight:
		x -= w * k
	}
	for py := 0; py < 13; py++ {
		for px := 0; px < w; px++ {
			if _, _, _, alpha := tmp.At(px, py).RGBA(); alpha > 0x8000 {
				c.fill(image.Rect(x+px*k, y+py*k, x+(px+1)*k, y+(py+1)*k), col)
			}
		}
	}
}

// vtext draws s turned a quarter left, centred on (x, y).
func (c *canvas) vtext(x, y int, s string, col color.Color) {
	face := basicfont.Face7x13
	w := font.MeasureString(face, s).Round()
	tmp := image.NewRGBA(image.Rect(0, 0, w, 13))
	d := font.Drawer{Dst: tmp, Src: &image.Uniform{col}, Face: face, Dot: fixed.P(0, 10)}
	d.DrawString(s)
	for py := 0; py < 13; py++ {
		for px := 0; px < w; px++ {
			if _, _, _, alpha := tmp.At(px, py).RGBA(); alpha > 0x8000 {
				c.img.Set(x+py, y+w/2-px, col)
			}
		}
	}
}
