// Command devwatch is the live summary of `make dev`: every few seconds one
// line a person can read, instead of a raw tail of JSON logs.
//
//	16:40:05  published 20.2/s  backlog NEW 3, PROCESSING 0, FAILED 0 (oldest 0.4s)  replicas :8081 412, :8082 398, :8083 405  consumer 1215 processed, 3 duplicates skipped
//
// It reads each worker's /metrics (outbox_events_published_total, per
// replica and summed for the rate), the first worker that answers /status
// (the backlog; every replica reports the same outbox), and the last
// "messages processed" line of the consumer's JSON log (its totals). A part
// that cannot be read is shown as "?" and read again next time: a worker
// that restarts or a log not written yet never stops the summary.
//
//	--workers       comma-separated base URLs (default http://127.0.0.1:8081)
//	--consumer-log  the consumer's log file (optional)
//	--every         how often to print (default 2s)
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	workers := flag.String("workers", "http://127.0.0.1:8081", "comma-separated base URLs of the workers")
	consumerLog := flag.String("consumer-log", "", "the consumer's log file")
	every := flag.Duration("every", 2*time.Second, "how often to print a line")
	flag.Parse()
	if *every < 100*time.Millisecond {
		fmt.Fprintln(os.Stderr, "devwatch: --every must be at least 100ms")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	w := &watcher{
		workers:     strings.Split(*workers, ","),
		consumerLog: *consumerLog,
		client:      &http.Client{Timeout: time.Second},
	}
	tick := time.NewTicker(*every)
	defer tick.Stop()
	for {
		fmt.Println(w.line(ctx, time.Now()))
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// watcher remembers the last published total, for the rate.
type watcher struct {
	workers     []string
	consumerLog string
	client      *http.Client

	lastTotal float64
	lastAt    time.Time
}

// line is one summary.
func (w *watcher) line(ctx context.Context, now time.Time) string {
	var b strings.Builder
	b.WriteString(now.Format("15:04:05"))

	total, known := 0.0, 0
	replicas := make([]string, 0, len(w.workers))
	for _, base := range w.workers {
		n, err := w.published(ctx, base)
		if err != nil {
			replicas = append(replicas, shortName(base)+" ?")
			continue
		}
		total += n
		known++
		replicas = append(replicas, fmt.Sprintf("%s %.0f", shortName(base), n))
	}
	switch {
	case known == 0:
		b.WriteString("  published ?")
	case !w.lastAt.IsZero() && total >= w.lastTotal:
		fmt.Fprintf(&b, "  published %.1f/s", (total-w.lastTotal)/now.Sub(w.lastAt).Seconds())
	default:
		b.WriteString("  published -/s") // the first reading, or a replica restarted
	}
	if known > 0 {
		w.lastTotal, w.lastAt = total, now
	}

	b.WriteString("  backlog " + w.backlog(ctx))
	b.WriteString("  replicas " + strings.Join(replicas, ", "))
	if w.consumerLog != "" {
		b.WriteString("  consumer " + consumerTotals(w.consumerLog))
	}
	return b.String()
}

// shortName is a worker's URL as ":port".
func shortName(base string) string {
	u, err := url.Parse(base)
	if err != nil || u.Port() == "" {
		return base
	}
	return ":" + u.Port()
}

func (w *watcher) get(ctx context.Context, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", u, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 8<<20))
}

// published is a worker's outbox_events_published_total.
func (w *watcher) published(ctx context.Context, base string) (float64, error) {
	body, err := w.get(ctx, strings.TrimRight(base, "/")+"/metrics")
	if err != nil {
		return 0, err
	}
	return publishedTotal(body)
}

// publishedTotal sums the samples of outbox_events_published_total in a
// Prometheus text exposition.
func publishedTotal(metrics []byte) (float64, error) {
	sc := bufio.NewScanner(bytes.NewReader(metrics))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var total float64
	found := false
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		// One sample per outbox the worker relays (label outbox), or one
		// without labels from a worker built before it had the label.
		if ok && (name == "outbox_events_published_total" || strings.HasPrefix(name, "outbox_events_published_total{")) {
			v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
			if err != nil {
				return 0, err
			}
			total, found = total+v, true
		}
	}
	if !found {
		return 0, fmt.Errorf("no outbox_events_published_total")
	}
	return total, nil
}

// backlog is the outbox's counts from the first worker whose /status
// answers.
func (w *watcher) backlog(ctx context.Context) string {
	for _, base := range w.workers {
		body, err := w.get(ctx, strings.TrimRight(base, "/")+"/status")
		if err != nil {
			continue
		}
		if s, err := formatStatus(body); err == nil {
			return s
		}
	}
	return "?"
}

// formatStatus is the backlog part of a /status body.
func formatStatus(body []byte) (string, error) {
	var st struct {
		Counts              map[string]int64 `json:"counts"`
		OldestNewAgeSeconds float64          `json:"oldestNewAgeSeconds"`
		WakeUp              string           `json:"wakeUp"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return "", err
	}
	s := fmt.Sprintf("NEW %d, PROCESSING %d, FAILED %d", st.Counts["NEW"], st.Counts["PROCESSING"], st.Counts["FAILED"])
	if st.Counts["NEW"] > 0 {
		s += fmt.Sprintf(" (oldest %.1fs)", st.OldestNewAgeSeconds)
	}
	return s, nil
}

// consumerTotals is the consumer's totals from the last report in its
// log; only the log's last 256 KiB are read.
func consumerTotals(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "?"
	}
	defer f.Close()
	const tail = 256 << 10
	if st, err := f.Stat(); err == nil && st.Size() > tail {
		_, _ = f.Seek(st.Size()-tail, io.SeekStart)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return "?"
	}
	return lastTotals(data)
}

// lastTotals formats the last consumer report found in a JSON log.
func lastTotals(log []byte) string {
	lines := bytes.Split(log, []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		var rec struct {
			Msg        string `json:"msg"`
			Processed  *int64 `json:"processed_total"`
			Duplicates int64  `json:"duplicates_skipped_total"`
		}
		if json.Unmarshal(lines[i], &rec) != nil || rec.Processed == nil {
			continue
		}
		return fmt.Sprintf("%d processed, %d duplicates skipped", *rec.Processed, rec.Duplicates)
	}
	return "waiting for its first report"
}
