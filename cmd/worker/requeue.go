package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/term"

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
		yes     bool
		by      string
		reason  string
	)
	cfg, _, err := loadConfig("requeue", args, getenv, operatorCommand, func(fs *flag.FlagSet) {
		named.define(fs, "`ID` of an event to requeue (repeatable; commas separate ids); a NEW event named so that is backing off before a retry is made due now", "requeued")
		fs.StringVar(&idsFrom, "ids-from", "", "`FILE` of event _ids to requeue, one per line, exactly (commas and spaces are part of an id); - reads standard input")
		fs.StringVar(&f.Type, "type", "", "requeue FAILED events of this `TYPE` (not those skipped: name them with --id)")
		fs.BoolVar(&f.All, "all", false, "requeue every FAILED event not skipped (asks first on a terminal; needs --yes otherwise)")
		fs.BoolVar(&yes, "yes", false, "requeue every FAILED event with --all without asking")
		fs.StringVar(&by, "by", "", "`NAME` of who requeues them, for the audit record (default: the user running the command)")
		fs.StringVar(&reason, "reason", "", "`TEXT` saying why, for the audit record")
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
	ask := everyFailed(f) && !dryRun && !yes
	tty := stdinTerminal(stderr)
	if ask && !tty.terminal {
		return fmt.Errorf("%w: requeue --all moves every FAILED event back to NEW, and standard input is not a terminal to confirm on: add --yes (or count them first with --dry-run)", ErrUsage)
	}
	ctx, store, closeFn, err := openStore(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	defer closeFn()
	if ask {
		failed, err := store.Requeue(ctx, f, true)
		if err != nil {
			return err
		}
		if failed > 0 {
			if err := tty.confirm(fmt.Sprintf("Requeue all %d FAILED events to NEW?", failed)); err != nil {
				return err
			}
		}
	}
	var n, due int
	change := func(ctx context.Context) (int, error) {
		var err error
		if n, err = inChunks(ctx, f, func(ctx context.Context, f mongo.RequeueFilter) (int, error) { return store.Requeue(ctx, f, dryRun) }); err != nil {
			return n, err
		}
		// Events named by id that are NEW and backing off before a retry
		// are made due now: the only way to cut short a backoff (a
		// far-future retryAt holds the event and its aggregate).
		due, err = inChunks(ctx, f, func(ctx context.Context, f mongo.RequeueFilter) (int, error) { return store.RetryNow(ctx, f, dryRun) })
		if err != nil {
			return n + due, fmt.Errorf("after %d FAILED events requeued: %w", n, err)
		}
		return n + due, nil
	}
	if dryRun {
		if _, err := change(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%d FAILED events would be requeued\n", n)
		if due > 0 {
			fmt.Fprintf(stdout, "%d NEW events backing off would be retried now\n", due)
		}
		return nil
	}
	if err := auditedCLIAction(ctx, store, stderr, mongo.Action{Name: "requeue", By: by, Reason: reason, Target: targetOf(f), Outbox: cfg.Outbox}, change); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "requeued %d FAILED events to NEW\n", n)
	if due > 0 {
		fmt.Fprintf(stdout, "%d NEW events backing off are due now (retryAt cleared)\n", due)
	}
	return nil
}

// targetOf says which events f chose, for the audit record.
func targetOf(f mongo.RequeueFilter) string {
	var parts []string
	if len(f.IDs) > 0 {
		parts = append(parts, "ids: "+strings.Join(f.IDs[:min(len(f.IDs), 20)], ", ")+more(len(f.IDs)-20))
	}
	if f.Type != "" {
		parts = append(parts, "type: "+f.Type)
	}
	if f.All {
		parts = append(parts, "all FAILED")
	}
	return strings.Join(parts, "; ")
}

// more says how many were left out of a list, if any.
func more(n int) string {
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf(" and %d more", n)
}

// recordCLIAction records an operator command's action, already done,
// in the audit collection, by the user running it unless a.By names
// someone. An action that changed nothing is not recorded. A record that
// cannot be written is said on stderr, and is the command's error, for an
// action nobody can account for is one to notice.
func recordCLIAction(ctx context.Context, store *mongo.Store, stderr io.Writer, a mongo.Action) error {
	if a.Count == 0 {
		return nil
	}
	a.At, a.Source = serverNow(ctx, store), "cli"
	a.By = cmp.Or(strings.TrimSpace(a.By), whoRuns())
	if err := store.RecordAction(ctx, a); err != nil {
		fmt.Fprintf(stderr, "the %s is done, but its audit record was not written: %v\n", a.Name, err)
		return err
	}
	return nil
}

// auditedCLIAction runs change audited whatever happens: its intent is
// recorded first (a command whose intent cannot be recorded changes
// nothing), then completed with the count change reached and how it
// ended, even when the command's time ran out or it was interrupted.
func auditedCLIAction(ctx context.Context, store *mongo.Store, stderr io.Writer, a mongo.Action, change func(ctx context.Context) (int, error)) error {
	a.At, a.Source = serverNow(ctx, store), "cli"
	a.By = cmp.Or(strings.TrimSpace(a.By), whoRuns())
	id, err := store.StartAction(ctx, a)
	if err != nil {
		return fmt.Errorf("nothing was done: %w", err)
	}
	n, err := change(ctx)
	state := mongo.ActionDone
	switch {
	case err != nil && ctx.Err() != nil:
		state = mongo.ActionCancelled
	case err != nil:
		state = mongo.ActionFailed
	}
	end, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	errText := ""
	if err != nil {
		errText = err.Error()
	}
	if ferr := store.FinishAction(end, id, state, n, errText, a.At); ferr != nil {
		fmt.Fprintf(stderr, "the %s changed %d events, but its audit record was not completed (it says started): %v\n", a.Name, n, ferr)
		return errors.Join(err, ferr)
	}
	return err
}

// everyFailed reports whether f chooses every FAILED event: --all with
// neither --id nor --type to narrow it.
func everyFailed(f mongo.RequeueFilter) bool {
	return f.All && len(f.IDs) == 0 && f.Type == ""
}

// errNotConfirmed is the answer of an operator who did not say yes.
var errNotConfirmed = errors.New("not confirmed: nothing requeued")

// terminal is where a command asks a person to confirm: standard input,
// and the prompt on standard error, which stays on the terminal when
// standard output is piped.
type terminal struct {
	in       io.Reader
	prompt   io.Writer
	terminal bool // whether in is a terminal, so a person can answer
}

func stdinTerminal(prompt io.Writer) terminal {
	f, ok := stdin.(*os.File)
	return terminal{in: stdin, prompt: prompt, terminal: ok && term.IsTerminal(int(f.Fd()))}
}

// confirm asks question and returns nil when the answer is y or yes, any
// case, and errNotConfirmed for anything else, an empty line and the end
// of the input included: only a deliberate yes acts.
func (c terminal) confirm(question string) error {
	fmt.Fprintf(c.prompt, "%s [y/N] ", question)
	line, err := bufio.NewReader(c.in).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read the answer: %w", err)
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return errNotConfirmed
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
