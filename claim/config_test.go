package claim

import (
	"testing"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	testenv.WantRefused(t, func(c Config) error { _, err := New(nil, nil, c); return err }, map[string]Config{
		"WorkerID":           {},
		"BatchSize -1":       {WorkerID: "w", BatchSize: -1},
		"BatchSize 10001":    {WorkerID: "w", BatchSize: 10001},
		"MaxAttempts -2":     {WorkerID: "w", MaxAttempts: -2},
		"MaxBodyBytes -1":    {WorkerID: "w", MaxBodyBytes: -1},
		"PublishTimeout -1s": {WorkerID: "w", PublishTimeout: -time.Second},
		"RetryMax 1s: want at least RetryMin (1m0s)": {WorkerID: "w", RetryMin: time.Minute, RetryMax: time.Second},
		`"bogus"`:         {WorkerID: "w", Schedule: "bogus"},
		"StaleAfter 1m0s": {WorkerID: "w", PublishTimeout: time.Minute, StaleAfter: time.Minute},
		`Format.Name "cloudevents": want one of plain, cloudevents-binary, cloudevents-structured`: {
			WorkerID: "w", Format: events.Format{Name: "cloudevents"}},
		`Format.Source "": want a non-empty URI-reference`: {
			WorkerID: "w", Format: events.Format{Name: events.FormatCloudEventsBinary}},
		`Format.Source "a b"`: {
			WorkerID: "w", Format: events.Format{Name: events.FormatCloudEventsStructured, Source: "a b"}},
		`Format.Prefix "ce_": want empty, cloudEvents_, cloudEvents: or ce-`: {
			WorkerID: "w", Format: events.Format{Name: events.FormatCloudEventsBinary, Source: "/a", Prefix: "ce_"}},
	})
	if _, err := New(nil, nil, Config{WorkerID: "w"}); err != nil {
		t.Errorf("New with only a worker id: %v, want the defaults to be valid", err)
	}
	if _, err := New(nil, nil, Config{WorkerID: "w", Format: events.Format{Name: events.FormatCloudEventsBinary, Source: "/outbox/a/b"}}); err != nil {
		t.Errorf("New with a CloudEvents format: %v", err)
	}
}
