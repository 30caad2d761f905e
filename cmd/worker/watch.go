package main

// The fleet file is watched, besides SIGHUP: a change reloads the
// outboxes (reload.go). Kubernetes updates a mounted ConfigMap by
// swapping a symlink (..data) in the file's directory, not by writing
// the file, so the directory is watched, and what counts as a change is
// a change of the file's content as read through its path: an event of
// another file in the directory, or an editor's several writes of one
// save, reload nothing more. Events are debounced: a reload follows
// the last of a burst by watchDebounce.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watchDebounce is how long the directory must be quiet after an event
// before the file is read: a save, a copy or a symlink swap is several
// events, and a half-written file would only be refused.
const watchDebounce = time.Second

// fileWatcher tells of changes to the content of one file.
type fileWatcher struct {
	path    string
	logger  *slog.Logger
	changed chan struct{} // buffered: one change pending is enough
	watcher *fsnotify.Watcher
	last    [sha256.Size]byte // the content last told of (or read at start)
	done    chan struct{}
}

// watchFile starts watching the file at path and returns the watcher; its
// changed channel receives once per change of the content. Close stops it.
func watchFile(path string, logger *slog.Logger) (*fileWatcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	if err := w.Add(filepath.Dir(path)); err != nil {
		_ = w.Close()
		return nil, err
	}
	fw := &fileWatcher{path: path, logger: logger, changed: make(chan struct{}, 1), watcher: w, done: make(chan struct{})}
	fw.last, _ = fw.digest()
	fw.watchTarget()
	go fw.loop()
	return fw, nil
}

// Changed receives once per change of the file's content.
func (fw *fileWatcher) Changed() <-chan struct{} { return fw.changed }

// Close stops the watch and waits for its goroutine.
func (fw *fileWatcher) Close() error {
	err := fw.watcher.Close()
	<-fw.done
	return err
}

func (fw *fileWatcher) loop() {
	defer close(fw.done)
	quiet := time.NewTimer(watchDebounce)
	quiet.Stop()
	for {
		select {
		case _, ok := <-fw.watcher.Events:
			if !ok {
				return
			}
			quiet.Reset(watchDebounce)
		case err, ok := <-fw.watcher.Errors:
			if !ok {
				return
			}
			fw.logger.Warn("fleet file watch: an event may have been missed; SIGHUP reloads", "error", err)
			quiet.Reset(watchDebounce)
		case <-quiet.C:
			fw.check()
		}
	}
}

// check tells of a change if the content differs from the last told of.
// A file that cannot be read now (a swap in progress) is looked at again
// at the next event.
func (fw *fileWatcher) check() {
	fw.watchTarget()
	sum, err := fw.digest()
	if err != nil || sum == fw.last {
		return
	}
	fw.last = sum
	select {
	case fw.changed <- struct{}{}:
	default: // one is pending: the reload reads the file as it is then
	}
}

// watchTarget watches the directory of the file the path leads to, when
// it is a symlink: after a swap that is a new directory (the former one's
// watch ends as it is removed). Adding a watched directory again is a
// no-op.
func (fw *fileWatcher) watchTarget() {
	target, err := filepath.EvalSymlinks(fw.path)
	if err != nil || filepath.Dir(target) == filepath.Dir(fw.path) {
		return
	}
	if err := fw.watcher.Add(filepath.Dir(target)); err != nil {
		fw.logger.Debug("fleet file watch: the directory of the file's target not watched", "error", err)
	}
}

func (fw *fileWatcher) digest() ([sha256.Size]byte, error) {
	data, err := os.ReadFile(fw.path)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	return sha256.Sum256(bytes.TrimSpace(data)), nil
}

// startFleetWatch starts the watch of the fleet file, if there is one,
// for run's reloads; a watch that cannot start leaves SIGHUP, and says
// so. The returned stop ends it.
func (w *worker) startFleetWatch(ctx context.Context) (stop func()) {
	if !w.fleet() || w.reload == nil {
		return func() {}
	}
	fw, err := watchFile(w.cfg.FleetFile, w.logger)
	if err != nil {
		w.logger.Warn("fleet file not watched: only SIGHUP reloads it", "fleet_file", w.cfg.FleetFile, "error", err)
		return func() {}
	}
	w.fileChanged = fw.Changed()
	return func() {
		if err := fw.Close(); err != nil && ctx.Err() == nil {
			w.logger.Warn("fleet file watch not closed", "error", err)
		}
	}
}
