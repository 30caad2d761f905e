package main

import (
	"context"
	"fmt"
	"math"
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
// steady rate, and measures createdAt to first receipt by a consumer.
func (b *bench) latency(ctx context.Context) error {
	for _, sched := range latencySchedules {
		l, err := b.latencyRun(ctx, sched)
		if err != nil {
			return fmt.Errorf("schedule %s: %w", sched, err)
		}
		b.res.Latency = append(b.res.Latency, l)
		fmt.Fprintf(b.out, "   %-13s %d of %d events: p50 %.0f ms, p90 %.0f ms, p99 %.0f ms, max %.0f ms; CPU %.1f ms per 1,000 events, peak RSS %.1f MB\n",
			sched, l.Received, l.Sent, l.P50ms, l.P90ms, l.P99ms, l.MaxMs, l.CPUMsPer1000, l.PeakRSSMB)
	}
	return nil
}

func (b *bench) latencyRun(ctx context.Context, sched string) (Latency, error) {
	slug := strings.NewReplacer("@every ", "", " ", "").Replace(sched)
	coll, err := b.collection(ctx, "latency_"+slug)
	if err != nil {
		return Latency{}, err
	}
	defer dropQuietly(coll)
	if err := b.createIndexes(ctx, coll); err != nil {
		return Latency{}, err
	}
	exchange := uniqueName("bench-latency-" + slug)
	cons, err := newConsumer(b.cfg.AMQPURL, exchange)
	if err != nil {
		return Latency{}, err
	}
	defer cons.close()
	w, err := b.startWorker(workerOpts{id: "bench-latency-" + slug, collection: coll.Name(), exchange: exchange, schedule: sched})
	if err != nil {
		return Latency{}, err
	}
	defer w.kill()
	if err := w.waitReady(ctx, 30*time.Second); err != nil {
		return Latency{}, err
	}
	time.Sleep(time.Second) // the claimer starts just after readiness

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
