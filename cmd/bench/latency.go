package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/events"
)

// latencySchedules are the claim schedules the latency runs compare: the
// worker's default and the fast one.
var latencySchedules = []string{claim.ScheduleDefault, "@every 100ms"}

// latency runs one worker at each schedule while events are written at a
// steady rate, and measures createdAt to first receipt by a consumer. Each
// schedule runs with the wake-up on insert (OUTBOX_WAKE_ON_INSERT) and,
// where the database supports it (a change stream opened), again without,
// so that the two are compared; where it does not, the report says so.
func (b *bench) latency(ctx context.Context) error {
	for _, sched := range latencySchedules {
		for _, wake := range []bool{true, false} {
			l, err := b.latencyRun(ctx, sched, wake)
			if err != nil {
				return fmt.Errorf("schedule %s: %w", sched, err)
			}
			latencyFig.set(b.res, append(latencyFig.value(b.res), l))
			fmt.Fprintf(b.out, "   %-13s wake-up %-13s %d of %d events: p50 %.0f ms, p90 %.0f ms, p99 %.0f ms, max %.0f ms; CPU %.1f ms per 1,000 events, peak RSS %.1f MB\n",
				sched, l.WakeUp, l.Received, l.Sent, l.P50ms, l.P90ms, l.P99ms, l.MaxMs, l.CPUMsPer1000, l.PeakRSSMB)
			if l.WakeUp == wakePolling {
				fmt.Fprintf(b.out, "   %-13s wake-up on insert not supported by this database (change streams refused): the run above polled; no separate run without it\n", sched)
				break
			}
		}
	}
	return nil
}

// Wake-up modes as /status reports them.
const (
	wakePolling = "polling"
	wakeOff     = "off"
)

// wakeMode waits for the worker's /status to say how claims are woken,
// past "starting", for up to ten seconds.
func (w *workerProc) wakeMode(ctx context.Context) string {
	mode := "unknown"
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var buf bytes.Buffer
		if code, err := httpGet(ctx, "http://"+w.addr+"/status", &buf); err != nil || code != http.StatusOK {
			continue
		}
		var st struct {
			WakeUp string `json:"wakeUp"`
		}
		if json.Unmarshal(buf.Bytes(), &st) == nil && st.WakeUp != "" {
			mode = st.WakeUp
			if mode != "starting" {
				break
			}
		}
	}
	return mode
}

func (b *bench) latencyRun(ctx context.Context, sched string, wake bool) (Latency, error) {
	slug := strings.NewReplacer("@every ", "", " ", "").Replace(sched)
	if !wake {
		slug += "_nowake"
	}
	coll, _, err := b.preparedCollection(ctx, "latency_"+slug)
	if err != nil {
		return Latency{}, err
	}
	defer dropQuietly(coll)
	exchange := uniqueName("bench-latency-" + slug)
	cons, err := newConsumer(b.cfg.AMQPURL, exchange)
	if err != nil {
		return Latency{}, err
	}
	defer cons.close()
	w, err := b.startWorker(workerOpts{id: "bench-latency-" + slug, collection: coll.Name(), exchange: exchange, schedule: sched,
		env: []string{fmt.Sprintf("OUTBOX_WAKE_ON_INSERT=%t", wake)}})
	if err != nil {
		return Latency{}, err
	}
	defer w.Kill()
	if err := w.waitReady(ctx, 30*time.Second); err != nil {
		return Latency{}, err
	}
	time.Sleep(time.Second) // the claimer starts just after readiness
	mode := w.wakeMode(ctx)

	// One event every 1/rate seconds, on a fixed timetable so that a slow
	// insert does not lower the rate.
	created := map[string]time.Time{}
	interval := time.Duration(float64(time.Second) / b.cfg.LatencyRate)
	total := int(b.cfg.LatencyRate * b.cfg.LatencyFor.Seconds())
	start := time.Now()
	for i := range total {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		doc, err := eventDoc(i, time.Now())
		if err != nil {
			return Latency{}, err
		}
		if _, err := coll.InsertOne(ctx, doc); err != nil {
			return Latency{}, fmt.Errorf("insert event %d: %w", i, err)
		}
		// createdAt as stored: BSON dates hold milliseconds.
		id, _ := value(doc, events.FieldID).(bson.ObjectID)
		at, _ := value(doc, events.FieldCreatedAt).(time.Time)
		created[id.Hex()] = at.Truncate(time.Millisecond)
	}
	if err := cons.waitFor(ctx, total, 30*time.Second); err != nil {
		return Latency{}, err
	}
	first, _ := cons.snapshot()
	st, err := w.stop(stopTimeout)
	if err != nil {
		return Latency{}, err
	}

	lat := make([]float64, 0, len(created))
	for id, c := range created {
		if r, ok := first[id]; ok {
			lat = append(lat, float64(r.Sub(c))/float64(time.Millisecond))
		}
	}
	slices.Sort(lat)
	return Latency{
		Schedule:     sched,
		WakeUp:       mode,
		Rate:         b.cfg.LatencyRate,
		Seconds:      b.cfg.LatencyFor.Seconds(),
		Sent:         total,
		Received:     len(lat),
		P50ms:        round(percentile(lat, 50), 1),
		P90ms:        round(percentile(lat, 90), 1),
		P99ms:        round(percentile(lat, 99), 1),
		MaxMs:        round(percentile(lat, 100), 1),
		CPUMsPer1000: round(1000*st.cpu.Seconds()/(float64(total)/1000), 1),
		PeakRSSMB:    round(st.peakRSSMB, 1),
	}, nil
}

// percentile is the nearest-rank percentile p of sorted xs.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[max(rank-1, 0)]
}

// latencyFig is the latency runs, one per schedule and wake-up mode.
var latencyFig = figure[[]Latency]{"latency"}

const targetP99 = "p99 latency at @every 100ms"

var latencyStage = stage{
	key: "latency", figures: []anyFigure{latencyFig},
	steps: one("latency", (*bench).latency), rows: latencyRows, targets: latencyTargets,
}

func latencyRows(r *Results, add addRow) {
	for _, l := range latencyFig.value(r) {
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
}

// latencyTargets: p99 under 300 ms at @every 100ms, from the first run
// at that schedule.
func latencyTargets(r *Results, add addTarget) {
	for _, l := range latencyFig.value(r) {
		if l.Schedule == "@every 100ms" {
			if l.Received > 0 {
				add(targetP99, "< 300 ms", fmt.Sprintf("%.0f ms", l.P99ms), l.P99ms < 300)
			}
			return
		}
	}
}
