package console_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/console"
	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/mongo/mongotest"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/ownership"
	"github.com/outboxrelay/outbox/service"
)

// quiet discards the log of the services the browser tests start.
var quiet = slog.New(slog.DiscardHandler)

// screenshotsEnv names the folder the browser test writes its screenshots
// to (make console-screenshots); unset, it writes none.
const screenshotsEnv = "OUTBOX_TEST_SCREENSHOTS"

// browser starts headless Chromium for the test. In CI a missing Chromium
// fails the test (.ci/run installs it); elsewhere it skips, saying so.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("chromium is not installed (apt-get install chromium); CI must run the console's browser test")
		}
		t.Skip("chromium is not installed (apt-get install chromium): the console's browser test did not run")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // the tests may run as root
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 900),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// outboxWithAFailure is a prepared store holding one FAILED event with a
// hostile payload and a history of two attempts, and a sampler that has
// sampled it.
func outboxWithAFailure(t *testing.T) (*mongo.Store, *ops.Sampler) {
	t.Helper()
	store := mongotest.Store(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	bad := mongotest.Event("bad-1", events.StatusFailed, now.Add(-time.Hour),
		bson.E{Key: events.FieldAggregateType, Value: "order"}, bson.E{Key: events.FieldAggregateID, Value: "o-1"},
		bson.E{Key: events.FieldAttempts, Value: 3},
		bson.E{Key: events.FieldLastError, Value: "gave up after 3 attempts: broker returned the message as unroutable: 312 NO_ROUTE"},
		bson.E{Key: events.FieldAttemptErrors, Value: bson.A{
			bson.D{{Key: "at", Value: now.Add(-30 * time.Minute)}, {Key: "workerId", Value: "relay-a-41"}, {Key: "reason", Value: "returned"}, {Key: "error", Value: "312 NO_ROUTE"}},
			bson.D{{Key: "at", Value: now.Add(-10 * time.Minute)}, {Key: "workerId", Value: "relay-b-7"}, {Key: "reason", Value: "max_attempts"}, {Key: "error", Value: "gave up after 3 attempts: 312 NO_ROUTE"}},
		}},
	)
	for i := range bad {
		if bad[i].Key == events.FieldPayload {
			bad[i].Value = bson.D{{Key: "note", Value: `<script>document.title="pwned"</script>`}}
		}
	}
	// A later event of its aggregate waits behind it, and an hour of
	// history fills the publish chart.
	docs := []bson.D{bad, mongotest.Event("new-1", events.StatusNew, now,
		bson.E{Key: events.FieldAggregateType, Value: "order"}, bson.E{Key: events.FieldAggregateID, Value: "o-1"})}
	// A paused type holds its aggregate: invoice i-9's first event is of
	// it, and a later one waits.
	for i, typ := range []string{"invoice.sent", "invoice.paid"} {
		d := mongotest.Event(fmt.Sprintf("inv-%d", i), events.StatusNew, now.Add(-time.Duration(20-i)*time.Minute),
			bson.E{Key: events.FieldAggregateType, Value: "invoice"}, bson.E{Key: events.FieldAggregateID, Value: "i-9"})
		for j := range d {
			if d[j].Key == events.FieldType {
				d[j].Value = typ
			}
		}
		docs = append(docs, d)
	}
	for i := range 600 {
		at := now.Add(-time.Duration(i*6) * time.Second)
		docs = append(docs, mongotest.Event(fmt.Sprintf("done-%03d", i), events.StatusPublished, at,
			bson.E{Key: events.FieldPublishedAt, Value: at.Add(time.Duration(i%7) * time.Second)}))
	}
	mongotest.Insert(t, store.Collection(), docs...)
	if _, err := store.Pause(t.Context(), events.Pause{Type: "invoice.sent", By: "ana", Reason: "the mail relay bounces everything, INC-2207", At: now.Add(-15 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	owners := store.Owners()
	var terms []ownership.Term
	for p := range events.Partitions {
		terms = append(terms, ownership.Term{Partition: p, Term: 1, Owner: []string{"relay-a-41", "relay-b-7"}[p%2], ExpiresAt: now.Add(time.Hour)})
	}
	if _, err := owners.Insert(t.Context(), terms); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"relay-a-41", "relay-b-7"} {
		if err := owners.Heartbeat(t.Context(), ownership.Member{WorkerID: w, SeenAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	sampler, err := ops.NewSampler(ops.SamplerConfig{
		Store: store, StaleAfter: time.Minute, Held: store, FailedHolds: true, Paused: store, Archetype: service.Archetype{Logger: quiet},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sampler.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sampler.Stop(context.Background()) })
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, ok := sampler.Latest(); ok {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the sampler took no sample in 30s")
		}
	}
	return store, sampler
}

// TestBrowserRequeueWithAReason drives a real browser through the console
// with its actions on: the overview, the FAILED count, the event with its
// attempts, a requeue with a reason, the event NEW and the audit entry.
func TestBrowserRequeueWithAReason(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	store, sampler := outboxWithAFailure(t)
	const token = "browser-test-token-0123"
	srv := startConsole(t, console.Config{
		Store: store, Samples: sampler, Owners: store.Owners(), TermLength: 30 * time.Second, FailedHolds: true,
		Writer: store, Token: token, Archetype: service.Archetype{Logger: quiet},
		Refresh: time.Hour, // no live refresh replaces a node the test is about to use
	})
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("ana:"+token))

	var failedCount, status, audit, title, paused string
	var attempts, bars int
	shots := screenshots(t)
	err := chromedp.Run(ctx,
		scheme("light"),
		network.Enable(),
		network.SetExtraHTTPHeaders(network.Headers{"Authorization": auth}),
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(`a.count.st-failed`),
		// The publish chart is drawn from its own request: wait for it,
		// so that nothing changes the page under the next steps.
		chromedp.WaitReady(`#chart rect`),
		chromedp.Evaluate(`document.querySelectorAll("#chart rect").length`, &bars),
		chromedp.Text(`a.count.st-failed .n`, &failedCount),
		shots.take("console-overview.png"),
		chromedp.Click(`a.count.st-failed`),
		chromedp.WaitVisible(`a[href="/events/bad-1"]`),
		shots.take("console-events.png"),
		chromedp.Click(`a[href="/events/bad-1"]`),
		chromedp.WaitVisible(`form.action input[name="reason"]`),
		chromedp.Evaluate(`document.querySelectorAll("h2 + table tbody tr").length`, &attempts),
		chromedp.Title(&title),
		shots.take("console-event.png"),
		chromedp.SendKeys(`form[action="/events/bad-1/requeue"] input[name="reason"]`, "route bound again"),
		chromedp.Click(`form[action="/events/bad-1/requeue"] button`),
		chromedp.WaitVisible(`dd.st-new`),
		chromedp.Text(`dd.st-new`, &status),
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(`form[action="/pause"]`),
		chromedp.WaitReady(`#chart rect`),
		chromedp.SendKeys(`form[action="/pause"] input[name="type"]`, "order.shipped"),
		chromedp.SendKeys(`form[action="/pause"] input[name="reason"]`, "warehouse API down"),
		chromedp.Click(`form[action="/pause"] button`),
		// Only the page after the pause has this row: the one before has
		// the other paused type's.
		chromedp.WaitVisible(`tr.paused a[href$="type=order.shipped"]`),
		chromedp.Text(`#paused + table`, &paused),
		chromedp.Navigate(srv.URL+"/audit"),
		chromedp.WaitVisible(`main table`),
		chromedp.Text(`main table`, &audit),
		shots.take("console-audit.png"),
	)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	if bars != 60 {
		t.Errorf("the publish chart has %d bars, want one a minute of the last hour", bars)
	}
	if strings.TrimSpace(failedCount) != "1" {
		t.Errorf("the overview counts %q FAILED events, want 1", failedCount)
	}
	if attempts != 2 || strings.Contains(title, "pwned") {
		t.Errorf("the event's page lists %d failed attempts (want 2), title %q (the payload's script must not run)", attempts, title)
	}
	if !strings.HasPrefix(strings.TrimSpace(status), "NEW") {
		t.Errorf("after the requeue the event's status reads %q, want NEW", status)
	}
	if !strings.Contains(audit, "ana") || !strings.Contains(audit, "route bound again") || !strings.Contains(audit, "requeue") {
		t.Errorf("the audit page does not list ana's requeue:\n%s", audit)
	}
	if !strings.Contains(paused, "order.shipped") || !strings.Contains(paused, "warehouse API down") || !strings.Contains(paused, "invoice.sent") {
		t.Errorf("the overview's paused types after pausing order.shipped:\n%s", paused)
	}
	if !strings.Contains(audit, "pause") || !strings.Contains(audit, "type: order.shipped") {
		t.Errorf("the audit page does not list ana's pause:\n%s", audit)
	}
}

// TestBrowserReadOnly: read-only, the pages offer no action, and a POST
// forged from the page itself is refused.
func TestBrowserReadOnly(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	store, sampler := outboxWithAFailure(t)
	srv := startConsole(t, console.Config{Store: store, Samples: sampler, FailedHolds: true, Archetype: service.Archetype{Logger: quiet}, Refresh: time.Hour})
	var forms, forged int
	shots := screenshots(t)
	err := chromedp.Run(ctx,
		scheme("light"),
		chromedp.Navigate(srv.URL+"/failures"),
		chromedp.WaitVisible(`main table`),
		shots.take("console-failures.png"),
		chromedp.Navigate(srv.URL+"/held"),
		chromedp.WaitVisible(`main table`),
		shots.take("console-held.png"),
		chromedp.Navigate(srv.URL+"/events/bad-1"),
		chromedp.WaitVisible(`pre.doc`),
		chromedp.Evaluate(`document.querySelectorAll("form.action, button[type=submit]").length`, &forms),
		chromedp.Evaluate(`fetch("/events/bad-1/requeue", {method: "POST", body: new URLSearchParams({reason: "forged"})}).then(r => r.status)`, &forged,
			func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }),
	)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	if forms != 0 {
		t.Errorf("a read-only event page shows %d action controls, want none", forms)
	}
	if forged != 403 {
		t.Errorf("a forged POST got %d, want 403", forged)
	}
	if e, err := store.Find(t.Context(), "bad-1"); err != nil || e.Lookup(events.FieldStatus).StringValue() != string(events.StatusFailed) {
		t.Errorf("bad-1 after the forged POST: %v, %v; want it FAILED still", e, err)
	}
}

// TestBrowserDarkTheme: the console follows the system's dark theme
// (prefers-color-scheme), and the dark screenshots of docs/console.md are
// taken here.
func TestBrowserDarkTheme(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	store, sampler := outboxWithAFailure(t)
	srv := startConsole(t, console.Config{
		Store: store, Samples: sampler, Owners: store.Owners(), TermLength: 30 * time.Second, FailedHolds: true,
		Archetype: service.Archetype{Logger: quiet}, Refresh: time.Hour,
	})
	background := `getComputedStyle(document.body).backgroundColor`
	var light, dark, held string
	shots := screenshots(t)
	err := chromedp.Run(ctx,
		scheme("light"),
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(`a.count.st-failed`),
		chromedp.Evaluate(background, &light),
		scheme("dark"),
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(`a.count.st-failed`),
		chromedp.WaitReady(`#chart rect`),
		chromedp.Evaluate(background, &dark),
		shots.take("console-overview-dark.png"),
		chromedp.Navigate(srv.URL+"/events/bad-1"),
		chromedp.WaitVisible(`pre.doc`),
		shots.take("console-event-dark.png"),
		chromedp.Navigate(srv.URL+"/held"),
		chromedp.WaitVisible(`main table`),
		chromedp.Text(`main`, &held),
		shots.take("console-held-dark.png"),
	)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	if light != "rgb(255, 255, 255)" || dark != "rgb(13, 17, 23)" {
		t.Errorf("the page's background is %s in the light theme and %s in the dark one, want rgb(255, 255, 255) and rgb(13, 17, 23)", light, dark)
	}
	if !strings.Contains(held, "invoice.sent") || !strings.Contains(held, "invoice/i-9") || !strings.Contains(held, "is paused") {
		t.Errorf("the held page does not show invoice i-9 held by the paused type invoice.sent:\n%s", held)
	}
}

// scheme makes the browser's pages see prefers-color-scheme as "light"
// or "dark", as a system theme would set it.
func scheme(s string) chromedp.Action {
	return emulation.SetEmulatedMedia().WithFeatures([]*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: s}})
}

// shooter takes the pages' screenshots into the folder screenshotsEnv
// names, for docs/console.md; without it, nothing.
type shooter struct {
	t   *testing.T
	dir string
}

func screenshots(t *testing.T) shooter { return shooter{t: t, dir: os.Getenv(screenshotsEnv)} }

func (s shooter) take(name string) chromedp.Action {
	return chromedp.ActionFunc(func(ctx context.Context) error {
		if s.dir == "" {
			return nil
		}
		var png []byte
		if err := chromedp.FullScreenshot(&png, 100).Do(ctx); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(s.dir, name), png, 0o644)
	})
}
