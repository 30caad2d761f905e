package main

// A reload brings the outboxes the worker relays to those it wants now,
// without a restart: the fleet file as it now reads (on SIGHUP, or when
// the file changes: watch.go), and the databases discovery finds
// (discover.go). An outbox no longer wanted stops as it would at a stop
// (its claimer finishes the batch in flight, then its ownership gives its
// partitions back, so that no other replica waits out a term), one newly
// wanted starts, and one whose settings changed stops and starts again
// with them. The outboxes left as they were keep relaying, and a file
// that does not load changes nothing. Only the outboxes are reloaded: the
// worker's own settings (the broker, the HTTP address, the timeouts) take
// a restart. Every reload runs on run's goroutine, one at a time.

import (
	"context"
	"reflect"
	"slices"
	"sync"

	"github.com/outboxrelay/outbox/ops"
)

// reloadOutboxes reads the fleet file again and applies it, with what
// discovery finds in the databases of its patterns; trigger says why,
// for the log. runCtx is run's, under which the outboxes it starts run.
func (w *worker) reloadOutboxes(runCtx context.Context, trigger string) {
	if w.reload == nil {
		return
	}
	spec, err := w.reload()
	if err != nil {
		w.logger.Error("reload refused: the outboxes relay as before", "trigger", trigger, "error", err)
		return
	}
	w.spec = spec
	next := w.discover(runCtx)
	if runCtx.Err() == nil { // a stop meanwhile: nothing more to start
		w.apply(runCtx, next, trigger)
	}
}

// rediscover applies what discovery finds now, the file as last loaded.
func (w *worker) rediscover(runCtx context.Context) {
	if !w.hasTemplates() {
		return
	}
	next := w.discover(runCtx)
	if runCtx.Err() == nil {
		w.apply(runCtx, next, "discovery")
	}
}

// outboxDiff is what a reload changes: the outboxes to stop (removed,
// and the former services of those changed) and those to start (added,
// and the new services of those changed), with their names for the log.
type outboxDiff struct {
	stopping                []*relayedOutbox
	starting                []outboxConfig
	added, removed, changed []string
}

// diffOutboxes compares the running outboxes with those wanted (next).
func diffOutboxes(running []*relayedOutbox, next []outboxConfig) outboxDiff {
	var d outboxDiff
	current := map[string]*relayedOutbox{}
	for _, o := range running {
		current[o.name] = o
	}
	for _, oc := range next {
		o, ok := current[oc.Name]
		switch {
		case !ok:
			d.starting, d.added = append(d.starting, oc), append(d.added, oc.Name)
		case !sameOutbox(o.oc, oc):
			d.stopping, d.starting, d.changed = append(d.stopping, o), append(d.starting, oc), append(d.changed, oc.Name)
		}
		delete(current, oc.Name)
	}
	for _, o := range running { // in their order, for the log
		if _, gone := current[o.name]; gone {
			d.stopping, d.removed = append(d.stopping, o), append(d.removed, o.name)
		}
	}
	return d
}

// apply brings the running outboxes to next.
func (w *worker) apply(runCtx context.Context, next []outboxConfig, trigger string) {
	d := diffOutboxes(w.outboxes, next)
	if len(d.stopping) == 0 && len(d.starting) == 0 {
		level := w.logger.Info
		if trigger == "discovery" {
			level = w.logger.Debug // every interval
		}
		level("reload: no outbox changed", "trigger", trigger)
		return
	}
	// Stopped first: a changed outbox's new services must not claim
	// beside its old ones, and its metrics' label must be free.
	w.stopOutboxes(d.stopping)
	kept := slices.DeleteFunc(slices.Clone(w.outboxes), func(o *relayedOutbox) bool { return slices.Contains(d.stopping, o) })
	var fresh []*relayedOutbox
	for _, oc := range d.starting {
		o, err := w.newOutbox(oc)
		if err != nil {
			w.logger.Error("reload: outbox not started", "outbox", oc.Name, "error", err)
			continue
		}
		fresh = append(fresh, o)
	}
	w.setOutboxes(next, slices.Concat(kept, fresh))
	w.dropUnusedClients(runCtx)
	for _, o := range fresh {
		w.launch(runCtx, nil, o, nil)
	}
	w.logger.Info("outboxes reloaded", "added", d.added, "removed", d.removed, "changed", d.changed,
		"outboxes", outboxNames(next), "trigger", trigger)
}

// setOutboxes makes running the worker's outboxes, in next's order, for
// /status, and tells the HTTP endpoints.
func (w *worker) setOutboxes(next []outboxConfig, running []*relayedOutbox) {
	byName := map[string]*relayedOutbox{}
	for _, o := range running {
		byName[o.name] = o
	}
	w.outboxes = w.outboxes[:0:0]
	var opsOutboxes []ops.Outbox
	for _, oc := range next {
		if o, ok := byName[oc.Name]; ok {
			w.outboxes = append(w.outboxes, o)
			opsOutboxes = append(opsOutboxes, o.opsOutbox())
		}
	}
	if err := w.http.SetOutboxes(opsOutboxes); err != nil {
		w.logger.Error("reload: the HTTP endpoints still report on the former outboxes", "error", err)
	}
}

// stopOutboxes stops outboxes side by side, each within the shutdown
// timeout, and unregisters their metrics.
func (w *worker) stopOutboxes(outboxes []*relayedOutbox) {
	var wg sync.WaitGroup
	for _, o := range outboxes {
		wg.Go(func() {
			o.cancel() // ends a start still waiting for its database
			ctx, cancel := context.WithTimeout(context.Background(), w.cfg.ShutdownTimeout)
			defer cancel()
			errs, late := o.stop(ctx)
			for _, err := range errs {
				o.logger.Error("reload: outbox stopped with errors", "error", err)
			}
			if late != nil {
				o.logger.Error("reload: the shutdown timeout ran out before these could stop", "services", late)
			}
			o.metrics.Unregister(outboxRegisterer(w.reg, o.name))
			o.logger.Info("outbox stopped")
		})
	}
	wg.Wait()
}

// dropUnusedClients disconnects the database clients that neither an
// outbox nor discovery (an entry of a pattern on that cluster) uses any
// more.
func (w *worker) dropUnusedClients(ctx context.Context) {
	for uri, client := range w.clients {
		if slices.ContainsFunc(w.outboxes, func(o *relayedOutbox) bool { return o.cfg.MongoURI == uri }) ||
			slices.ContainsFunc(w.spec, func(oc outboxConfig) bool { return oc.template() && oc.MongoURI == uri }) {
			continue
		}
		if err := client.Disconnect(context.WithoutCancel(ctx)); err != nil {
			w.logger.Warn("reload: database client not disconnected", "error", err)
		}
		delete(w.clients, uri)
	}
}

// sameOutbox reports whether a reload leaves the outbox a as it is: its
// settings are b's. The auto batch bound is left out: it is shared among
// the outboxes, and an outbox added or removed would otherwise restart
// every other; those kept keep the share they started with until the
// next restart.
func sameOutbox(a, b outboxConfig) bool {
	if a.BatchBytesAuto && b.BatchBytesAuto {
		b.BatchBytes = a.BatchBytes
	}
	return reflect.DeepEqual(a, b)
}
