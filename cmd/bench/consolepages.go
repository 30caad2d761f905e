package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/benchorder"
	"github.com/outboxrelay/outbox/metrics"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/service"
)

// ConsolePages is how long the operator console takes to answer each of
// its pages on the bench's collection.
type ConsolePages struct {
	Published int         `json:"published"`
	Failed    int         `json:"failed"`
	New       int         `json:"new"`
	Pages     []PageTimes `json:"pages"`
}

// PageTimes is one page's answers, in milliseconds, and their median.
type PageTimes struct {
	Path     string    `json:"path"`
	MedianMs float64   `json:"medianMs"`
	RunsMs   []float64 `json:"runsMs"`
	// Error is why the page did not answer 200, when it did not: the
	// stage goes on to the next page.
	Error string `json:"error,omitempty"`
	// Commands are the database commands of the page's last run.
	Commands []PageCommand `json:"commands,omitempty"`
}

var consoleFig = figure[ConsolePages]{"consolePages"}

var consolePagesStage = stage{
	key: "console", figures: []anyFigure{consoleFig},
	steps: one("console pages", (*bench).consolePages), rows: consoleRows,
	targets: func(*Results, addTarget) {},
}

// consoleGroupsRead names the read of the failure groups among the
// pages: the console's sampler's, on its schedule, which no page waits
// for.
const (
	consoleGroupsRead  = "(the failure groups' read, by the console's sampler every 15 s)"
	consoleHoldersRead = "(the held aggregates' holders' read, by the console's sampler every 15 s)"
)

// consolePageRuns is how many times each page is fetched.
const consolePageRuns = 5

// consoleFailed and consoleNew are the FAILED and NEW events beside the
// backlog's published history: enough failures to group, and a page of
// held aggregates.
const (
	consoleFailed = 1000
	consoleNew    = 1000
)

func consoleRows(r *Results, add addRow) {
	c := consoleFig.value(r)
	for _, p := range c.Pages {
		got := fmt.Sprintf("median %.0f ms of %d", p.MedianMs, len(p.RunsMs))
		if len(p.Commands) > 0 {
			got += fmt.Sprintf("; %d commands", len(p.Commands))
			if decoded, ok := decodedSum(p.Commands); ok {
				got += fmt.Sprintf(", %s documents decoded by FerretDB", thousands(int(decoded)))
			}
		}
		if p.Error != "" {
			got += "; " + p.Error
		}
		what := "Console page " + p.Path
		switch p.Path {
		case consoleGroupsRead:
			what = "Console failure groups, read by its sampler, not a page"
		case consoleHoldersRead:
			what = "Console held aggregates' holders, read by its sampler, not a page"
		}
		add(fmt.Sprintf("%s (%s PUBLISHED, %s FAILED, %s NEW)", what, thousands(c.Published), thousands(c.Failed), thousands(c.New)), got, "")
	}
}

// consolePages times the console's pages, read-only, over a collection of
// the backlog's size in PUBLISHED history (the last hour of it), FAILED
// events of five causes and NEW events waiting behind them.
func (b *bench) consolePages(ctx context.Context) error {
	coll, _, err := b.preparedCollection(ctx, "console")
	if err != nil {
		return err
	}
	defer dropQuietly(coll)
	// The console's own client, whose commands are logged page by page.
	cmdLog := newCommandLog()
	client, err := driver.Connect(options.Client().ApplyURI(b.mongoURI).SetMaxPoolSize(20).SetAppName("outbox-bench-console").SetMonitor(cmdLog.monitor()))
	if err != nil {
		return fmt.Errorf("console pages: connect: %w", err)
	}
	defer func() { _ = client.Disconnect(context.WithoutCancel(ctx)) }()
	store := b.store(client, client.Database(databaseName).Collection(coll.Name()))
	if err := store.Detect(ctx); err != nil {
		return err
	}
	if err := store.EnsureBrowseIndex(ctx); err != nil {
		return err
	}
	now := time.Now().UTC()
	c := ConsolePages{Published: b.cfg.Backlog, Failed: consoleFailed, New: consoleNew}
	for _, part := range []struct {
		n  int
		mk func(i int, at time.Time) (bson.D, error)
	}{
		{c.Published, func(i int, _ time.Time) (bson.D, error) {
			return publishedDoc(i, now.Add(-time.Duration(i)*time.Hour/time.Duration(c.Published)))
		}},
		{c.Failed, failedDoc},
		{c.New, eventDoc},
	} {
		if _, err := insertEvents(ctx, coll, part.n, 0, part.mk); err != nil {
			return err
		}
	}
	arch := service.Archetype{Logger: b.logger, Metrics: metrics.New(nil)}
	// The pages show counts the bench knows: the sampler's are the
	// worker's leader's job, not the pages', and on FerretDB its count of
	// unknown statuses reads every document (at 200,000 it does not
	// finish within its deadline), which would slow each page beside it.
	samples := knownCounts{Sample: ops.Sample{At: now, Stats: events.Stats{Counts: map[events.Status]int64{
		events.StatusPublished: int64(c.Published), events.StatusFailed: int64(c.Failed), events.StatusNew: int64(c.New),
	}}}}
	lists := &knownLists{}
	con, err := console.New(console.Config{Archetype: arch, Store: store, Samples: samples, Lists: lists, Owners: store.Owners(), TermLength: 30 * time.Second, FailedHolds: true})
	if err != nil {
		return err
	}
	srv := httptest.NewServer(con)
	defer srv.Close()
	failed, _, err := store.ListEvents(ctx, mongo.EventQuery{Status: events.StatusFailed, Limit: 1})
	if err != nil || len(failed) == 0 {
		return fmt.Errorf("console pages: read a FAILED event: %v", err)
	}
	id, ok := failed[0].Lookup(events.FieldID).ObjectIDOK()
	if !ok {
		return fmt.Errorf("console pages: the FAILED event's _id is no ObjectID")
	}
	oneFailed := "/events/" + id.Hex()
	group := url.Values{"status": {"FAILED"}, "reason": {metrics.ReasonMaxAttempts},
		"cause": {events.Cause(fmt.Sprintf("gave up after 5 attempts: broker nacked the message %d", 1))}}
	counted := map[string]int64{}
	// measure times run consolePageRuns times, and logs the commands of
	// the last run and, on FerretDB, the documents each decoded.
	measure := func(path string, run func() error) {
		p, err := timeRuns(func() error { cmdLog.take(); return run() })
		if err != nil {
			p.Error = err.Error()
		}
		p.Path = path
		var filters []bson.Raw
		p.Commands, filters = cmdLog.take()
		if b.ferret {
			countDecoded(ctx, b.db, p.Commands, filters, counted)
		} else {
			for i := range p.Commands {
				p.Commands[i].Decoded = -1
			}
		}
		c.Pages = append(c.Pages, p)
		fmt.Fprintf(b.out, "   %s: median %.0f ms %v %s\n      %s\n", path, p.MedianMs, p.RunsMs, p.Error, describeCommands(p.Commands))
	}
	// The failure groups and the held aggregates' holders, read as the
	// console's sampler reads them on its schedule
	// (ops.SamplerConfig.Failures and Holders): no page waits for them.
	measure(consoleGroupsRead, func() error {
		g, err := store.FailureGroups(ctx, now, ops.FailureGroupsLimit)
		if err == nil {
			lists.groups.Store(&g)
		}
		return err
	})
	measure(consoleHoldersRead, func() error {
		list, capped, err := store.Holders(ctx, now, true, ops.HoldersLimit)
		if err == nil {
			lists.holders.Store(&events.Holders{At: now, List: list, Capped: capped})
		}
		return err
	})
	// The pages an operator opens in an incident first, then the ones
	// that read the PUBLISHED history by design.
	for _, path := range []string{
		"/", "/failures", "/held", "/audit", oneFailed, "/events?status=FAILED", "/events?" + group.Encode(),
		"/events?status=FAILED&type=rare.type", "/events?status=FAILED&aggregate=" + benchorder.AggregateID(7),
		"/events?status=PUBLISHED", "/events?status=PUBLISHED&type=rare.type", "/events?status=PUBLISHED&aggregate=" + benchorder.AggregateID(7),
		"/events?status=FAILED&error=NO_ROUTE", "/api/overview", "/api/published",
	} {
		measure(path, func() error { return fetchPage(ctx, srv.URL+path) })
	}
	consoleFig.set(b.res, c)
	return nil
}

// timeRuns runs run consolePageRuns times and times each. A run that
// fails is timed too, and the error is the first one.
func timeRuns(run func() error) (PageTimes, error) {
	var p PageTimes
	var first error
	for range consolePageRuns {
		t0 := time.Now()
		err := run()
		d := time.Since(t0)
		p.RunsMs = append(p.RunsMs, round(float64(d)/float64(time.Millisecond), 1))
		if err != nil && first == nil {
			first = fmt.Errorf("run %d failed after %s: %w", len(p.RunsMs), d.Round(time.Millisecond), err)
		}
	}
	p.MedianMs = median(p.RunsMs)
	return p, first
}

// fetchPage fetches url and reads its answer, an error unless it is 200.
func fetchPage(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("console page %s: %w", url, err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("answered %d", resp.StatusCode)
	}
	return err
}

// failedDoc is a FAILED event of one of five causes, with its last attempt.
func failedDoc(i int, at time.Time) (bson.D, error) {
	doc, err := eventDoc(i, at)
	if err != nil {
		return nil, err
	}
	for j := range doc {
		if doc[j].Key == events.FieldStatus {
			doc[j].Value = events.StatusFailed
		}
	}
	causes := []string{
		"gave up after 5 attempts: broker returned the message as unroutable: 312 NO_ROUTE (routing key \"order.%d\")",
		"gave up after 5 attempts: broker nacked the message %d",
		"invalid event: field \"payload\" must be a document, got string (%d)",
		"publish timed out with the message published alone 3 times (%d)",
		"claim went stale on its last attempt (%d of 5): its worker stopped or hung",
	}
	msg := fmt.Sprintf(causes[i%len(causes)], i)
	return append(doc,
		bson.E{Key: events.FieldAttempts, Value: 5},
		bson.E{Key: events.FieldLastError, Value: msg},
		bson.E{Key: events.FieldFailedAt, Value: at},
		bson.E{Key: events.FieldAttemptErrors, Value: bson.A{bson.D{
			{Key: "at", Value: at}, {Key: "workerId", Value: "bench"}, {Key: "reason", Value: metrics.ReasonMaxAttempts}, {Key: "error", Value: msg},
		}}},
	), nil
}

// decodedSum is the documents FerretDB decoded for cmds, and whether
// every one was counted.
func decodedSum(cmds []PageCommand) (int64, bool) {
	var sum int64
	for _, c := range cmds {
		if c.Decoded < 0 && c.Pushdown != "" {
			return 0, false
		}
		sum += max(c.Decoded, 0)
	}
	return sum, true
}

// knownCounts is a sample source of counts given.
type knownCounts struct{ ops.Sample }

func (k knownCounts) Latest() (ops.Sample, bool) { return k.Sample, true }

// knownLists is a list source of the lists the bench read last, as the
// console's sampler keeps them; none before the first read.
type knownLists struct {
	groups  atomic.Pointer[events.FailureGroups]
	holders atomic.Pointer[events.Holders]
}

func (k *knownLists) LatestGroups() (events.FailureGroups, bool) {
	g := k.groups.Load()
	if g == nil {
		return events.FailureGroups{}, false
	}
	return *g, true
}

func (k *knownLists) LatestHolders() (events.Holders, bool) {
	h := k.holders.Load()
	if h == nil {
		return events.Holders{}, false
	}
	return *h, true
}

func (k *knownLists) Trigger() {}
