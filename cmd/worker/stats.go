package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/events"
)

// statsCommand is `worker stats`.
func statsCommand(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer, stderr io.Writer) error {
	var asJSON bool
	ctx, cfg, store, closeFn, err := startOperator(ctx, "stats", args, getenv, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print JSON")
	}, nil)
	if err != nil {
		return err
	}
	defer closeFn()
	now := serverNow(ctx, store)
	st, err := store.Stats(ctx, now.Add(-cfg.StaleAfter))
	if err != nil {
		return err
	}
	held, err := store.Held(ctx, now, cfg.OrderingAfterFailed == claim.AfterFailedWait)
	if err != nil {
		return err
	}
	paused, err := store.PausedTypes(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		out := map[string]any{
			"pausedTypes":          paused,
			"counts":               st.Counts,
			"oldestNewAgeSeconds":  st.OldestNewAge(now).Seconds(),
			"staleProcessing":      st.Stale,
			"staleAfterSeconds":    cfg.StaleAfter.Seconds(),
			"heldAggregates":       held.Aggregates,
			"oldestHeldAgeSeconds": held.OldestAge(now).Seconds(),
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STATUS\tEVENTS")
	for _, s := range events.CountedStatuses {
		fmt.Fprintf(tw, "%s\t%d\n", s, st.Counts[s])
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "oldest NEW event\t%s\n", ageOrNone(st.OldestNewAge(now), st.OldestNew.IsZero()))
	fmt.Fprintf(tw, "stale PROCESSING (older than %s)\t%d\n", cfg.StaleAfter, st.Stale)
	fmt.Fprintf(tw, "held aggregates\t%d\n", held.Aggregates)
	fmt.Fprintf(tw, "oldest held event\t%s\n", ageOrNone(held.OldestAge(now), held.OldestWaiting.IsZero()))
	if len(paused) == 0 {
		fmt.Fprintf(tw, "paused types\tnone\n")
	}
	for _, p := range paused {
		fmt.Fprintf(tw, "paused type %s\tby %s, %s ago: %s\n", p.Type, p.By, now.Sub(p.At).Round(time.Second), p.Reason)
	}
	return tw.Flush()
}

func ageOrNone(age time.Duration, none bool) string {
	if none {
		return "none"
	}
	return age.Round(time.Millisecond).String() + " old"
}
