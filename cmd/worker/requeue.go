package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/outboxrelay/outbox/mongo"
)

// stdin is what `--ids-from -` reads; a variable so that a test can give
// the command its input.
var stdin io.Reader = os.Stdin

// requeueChunk is how many ids one requeue command names, so that a long
// list read from a file stays far below MongoDB's 16 MiB command limit.
const requeueChunk = 1000

// readIDs reads one id per line from path, or from standard input when
// path is "-". A line is the id exactly, commas and spaces included; only
// its line ending (\n or \r\n) is dropped, and empty lines are skipped.
func readIDs(path string) ([]string, error) {
	r := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("%w: --ids-from: %v", ErrUsage, err)
		}
		defer f.Close()
		r = f
	}
	var ids []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if id := strings.TrimSuffix(sc.Text(), "\r"); id != "" {
			ids = append(ids, id)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read ids from %s: %w", path, err)
	}
	return ids, nil
}

// requeueCommand is `worker requeue`.
func requeueCommand(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer, stderr io.Writer) error {
	var (
		f       mongo.RequeueFilter
		named   namedEvents
		idsFrom string
	)
	cfg, _, err := loadConfig("requeue", args, getenv, operatorCommand, func(fs *flag.FlagSet) {
		named.define(fs, "`ID` of an event to requeue (repeatable; commas separate ids); a NEW event named so that is backing off before a retry is made due now", "requeued")
		fs.StringVar(&idsFrom, "ids-from", "", "`FILE` of event _ids to requeue, one per line, exactly (commas and spaces are part of an id); - reads standard input")
		fs.StringVar(&f.Type, "type", "", "requeue FAILED events of this `TYPE`")
		fs.BoolVar(&f.All, "all", false, "requeue every FAILED event")
	})
	if err != nil {
		return err
	}
	f.IDs = named.ids
	dryRun := named.dryRun
	if idsFrom != "" {
		more, err := readIDs(idsFrom)
		if err != nil {
			return err
		}
		if len(more) == 0 {
			return fmt.Errorf("%w: --ids-from %s holds no id", ErrUsage, idsFrom)
		}
		f.IDs = append(f.IDs, more...)
	}
	if len(f.IDs) == 0 && f.Type == "" && !f.All {
		return fmt.Errorf("%w: requeue needs --id, --ids-from, --type or --all", ErrUsage)
	}
	f.IDs = distinct(f.IDs) // an id named twice must not count twice in a dry run
	ctx, store, closeFn, err := openStore(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	defer closeFn()
	n, err := inChunks(ctx, f, func(ctx context.Context, f mongo.RequeueFilter) (int, error) { return store.Requeue(ctx, f, dryRun) })
	if err != nil {
		return err
	}
	// Events named by id that are NEW and backing off before a retry are
	// made due now: the only way to cut short a backoff (a far-future
	// retryAt holds the event and its aggregate).
	due, err := inChunks(ctx, f, func(ctx context.Context, f mongo.RequeueFilter) (int, error) { return store.RetryNow(ctx, f, dryRun) })
	if err != nil {
		return fmt.Errorf("after %d FAILED events requeued: %w", n, err)
	}
	if dryRun {
		fmt.Fprintf(stdout, "%d FAILED events would be requeued\n", n)
		if due > 0 {
			fmt.Fprintf(stdout, "%d NEW events backing off would be retried now\n", due)
		}
		return nil
	}
	fmt.Fprintf(stdout, "requeued %d FAILED events to NEW\n", n)
	if due > 0 {
		fmt.Fprintf(stdout, "%d NEW events backing off are due now (retryAt cleared)\n", due)
	}
	return nil
}

// inChunks runs op on f, its ids requeueChunk at a time, and adds up what
// each call counted.
func inChunks(ctx context.Context, f mongo.RequeueFilter, op func(context.Context, mongo.RequeueFilter) (int, error)) (int, error) {
	if len(f.IDs) == 0 {
		return op(ctx, f)
	}
	all, total := f.IDs, 0
	for chunk := range slices.Chunk(all, requeueChunk) {
		f.IDs = chunk
		n, err := op(ctx, f)
		total += n
		if err != nil {
			return total, fmt.Errorf("after %d: %w", total, err)
		}
	}
	return total, nil
}
