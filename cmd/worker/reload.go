package main

// A reload (SIGHUP) applies the fleet file as it now reads without a
// restart: an outbox no longer listed stops as it would at a stop (its
// claimer finishes the batch in flight, then its ownership gives its
// partitions back, so that no other replica waits out a term), one newly
// listed starts, and one whose entry changed stops and starts again with
// its new settings. The outboxes left as they were keep relaying, and a
// file that does not load changes nothing. Only the outboxes are
// reloaded: the worker's own settings (the broker, the HTTP address, the
// timeouts) take a restart.

import (
	"context"
	"reflect"
	"slices"
	"sync"

	"github.com/outboxrelay/outbox/ops"
)

// reloadOutboxes reloads the outboxes; runCtx is run's, under which the
// outboxes it starts run.
func (w *worker) reloadOutboxes(runCtx context.Context) {
	if w.reload == nil {
		return
	}
	next, err := w.reload()
	if err != nil {
		w.logger.Error("reload refused: the outboxes relay as before", "error", err)
		return
	}
	current := map[string]*relayedOutbox{}
	for _, o := range w.outboxes {
		current[o.name] = o
	}
	var stopping []*relayedOutbox
	var starting []outboxConfig
	var added, removed, changed []string
	for _, oc := range next {
		o, ok := current[oc.Name]
		switch {
		case !ok:
			starting, added = append(starting, oc), append(added, oc.Name)
		case !sameOutbox(o.oc, oc):
			stopping, starting, changed = append(stopping, o), append(starting, oc), append(changed, oc.Name)
		}
		delete(current, oc.Name)
	}
	for name, o := range current {
		stopping, removed = append(stopping, o), append(removed, name)
	}
	if len(stopping) == 0 && len(starting) == 0 {
		w.logger.Info("reload: no outbox changed")
		return
	}
	// Stopped first: a changed outbox's new services must not claim
	// beside its old ones, and its metrics' label must be free.
	w.stopOutboxes(stopping)
	kept := slices.DeleteFunc(slices.Clone(w.outboxes), func(o *relayedOutbox) bool { return slices.Contains(stopping, o) })
	var fresh []*relayedOutbox
	for _, oc := range starting {
		o, err := w.newOutbox(oc)
		if err != nil {
			w.logger.Error("reload: outbox not started", "outbox", oc.Name, "error", err)
			continue
		}
		fresh = append(fresh, o)
	}
	// In the file's order, for /status.
	byName := map[string]*relayedOutbox{}
	for _, o := range slices.Concat(kept, fresh) {
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
	w.dropUnusedClients(runCtx)
	for _, o := range fresh {
		w.launch(runCtx, nil, o, nil)
	}
	w.logger.Info("outboxes reloaded", "added", added, "removed", removed, "changed", changed,
		"outboxes", outboxNames(next))
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

// dropUnusedClients disconnects the database clients no outbox uses any
// more.
func (w *worker) dropUnusedClients(ctx context.Context) {
	for uri, client := range w.clients {
		if slices.ContainsFunc(w.outboxes, func(o *relayedOutbox) bool { return o.cfg.MongoURI == uri }) {
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
