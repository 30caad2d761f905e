package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// Writer changes the outbox as the console's actions ask, and records
// each action in the audit before and after it changes anything
// (mongo.Store).
type Writer interface {
	Requeue(ctx context.Context, f mongo.RequeueFilter, dryRun bool) (int, error)
	SkipSelected(ctx context.Context, ids []any, by, reason string, at time.Time, action bson.ObjectID) (int, error)
	DiscardSelected(ctx context.Context, ids []any, by, reason string, at time.Time, action bson.ObjectID) (int, error)
	Select(ctx context.Context, sel mongo.Selection, limit int) ([]any, int, error)
	Touched(ctx context.Context, action bson.ObjectID, ids []any) ([]any, error)
	StartAction(ctx context.Context, a mongo.Action) (bson.ObjectID, error)
	ProgressAction(ctx context.Context, id bson.ObjectID, count int) error
	FinishAction(ctx context.Context, id bson.ObjectID, state string, count int, errText string, at time.Time) error
	Pause(ctx context.Context, p events.Pause) (bool, error)
	Resume(ctx context.Context, typ string) (bool, error)
}

// Defaults of the actions' settings.
const (
	// RequeuePerSecondDefault spreads a group's requeue: this many events
	// come due each second.
	RequeuePerSecondDefault = 100
	// TokenMinLength is the least length of Config.Token.
	TokenMinLength = 16
	// auditShown is how many actions the audit page lists.
	auditShown = 200
	// auditTimeout bounds the recount and the write that complete an
	// action's record: with ActionTimeout (20 s by default) it stays
	// under `worker console`'s write timeout of 30 s.
	auditTimeout = 5 * time.Second
	// progressTimeout bounds each write of an action's progress, within
	// the action's own deadline.
	progressTimeout = 2 * time.Second
)

// reasonOf is the form's reason, required: every action says why.
func reasonOf(r *http.Request) (string, error) {
	reason := reasonValue(r)
	if reason == "" {
		return "", errBadRequest{"a reason is required: say why, for the audit"}
	}
	return reason, nil
}

// reasonValue is the form's reason as the action records it.
func reasonValue(r *http.Request) string { return strings.TrimSpace(r.PostFormValue("reason")) }

// requeueEvent requeues one FAILED event, skipped or not: the operator
// names it.
func (c *Console) requeueEvent(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	a := mongo.Action{Name: "requeue", Target: "ids: " + id, IDs: mongo.IDCandidates(id), Planned: 1}
	// A skipped event's aggregate has flowed past it: requeued, it is
	// published after later events of its aggregate. The page says so,
	// and the requeue must say it was read.
	doc, err := outboxOf(r).Store.Find(r.Context(), id)
	if err != nil && !errors.Is(err, mongo.ErrNoEvent) {
		c.refuse(w, r, err)
		return
	}
	if row := rowOf(doc); err == nil && row.Discarded {
		c.refuse(w, r, errBadRequest{"this event was discarded: it is never requeued"})
		return
	} else if err == nil && row.Skipped {
		if r.PostFormValue("confirm") != "skipped" {
			c.refuse(w, r, errBadRequest{"this event was skipped: its aggregate's later events flowed past it, and a requeue publishes it after them; confirm that on its page"})
			return
		}
		a.Target += " (skipped; requeued with its operator's confirmation)"
	}
	c.act(w, r, a, func(ctx context.Context, audit bson.ObjectID, progress func(int)) (int, error) {
		return outboxOf(r).Writer.Requeue(ctx, mongo.RequeueFilter{IDs: []string{id}, Progress: progress, Action: audit}, false)
	}, "/events/"+url.PathEscape(id))
}

// skipEvent marks one FAILED event skipped.
func (c *Console) skipEvent(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	a := mongo.Action{Name: "skip", Target: "ids: " + id, IDs: mongo.IDCandidates(id), Planned: 1}
	c.act(w, r, a, func(ctx context.Context, audit bson.ObjectID, _ func(int)) (int, error) {
		return outboxOf(r).Writer.SkipSelected(ctx, mongo.IDCandidates(id), actor(r), reasonValue(r), c.now(r), audit)
	}, "/events/"+url.PathEscape(id))
}

// discardEvent discards one FAILED event: it is kept and skipped, and
// never requeued. Only an admin may, with OIDC (mayAct).
func (c *Console) discardEvent(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if r.PostFormValue("confirm") != "discard" {
		c.refuse(w, r, errBadRequest{"a discard cannot be undone: confirm it on the event's page"})
		return
	}
	a := mongo.Action{Name: "discard", Target: "ids: " + id, IDs: mongo.IDCandidates(id), Planned: 1}
	c.act(w, r, a, func(ctx context.Context, audit bson.ObjectID, _ func(int)) (int, error) {
		return outboxOf(r).Writer.DiscardSelected(ctx, mongo.IDCandidates(id), actor(r), reasonValue(r), c.now(r), audit)
	}, "/events/"+url.PathEscape(id))
}

// typeOf is the form's event type, required.
func typeOf(r *http.Request, action string) (string, error) {
	typ := strings.TrimSpace(r.PostFormValue("type"))
	if typ == "" {
		return "", errBadRequest{"type is required: the event type to " + action}
	}
	return typ, nil
}

// pauseType pauses the form's event type: the relay claims none of its
// events until it is resumed. A type already paused keeps its first
// record, and the action counts 0.
func (c *Console) pauseType(w http.ResponseWriter, r *http.Request) {
	typ, err := typeOf(r, "pause")
	if err != nil {
		c.refuse(w, r, err)
		return
	}
	c.act(w, r, mongo.Action{Name: "pause", Target: "type: " + typ}, func(ctx context.Context, _ bson.ObjectID, _ func(int)) (int, error) {
		changed, err := outboxOf(r).Writer.Pause(ctx, events.Pause{Type: typ, By: actor(r), Reason: reasonValue(r), At: c.now(r)})
		return one(changed), err
	}, "/")
}

// resumeType resumes the form's event type.
func (c *Console) resumeType(w http.ResponseWriter, r *http.Request) {
	typ, err := typeOf(r, "resume")
	if err != nil {
		c.refuse(w, r, err)
		return
	}
	c.act(w, r, mongo.Action{Name: "resume", Target: "type: " + typ}, func(ctx context.Context, _ bson.ObjectID, _ func(int)) (int, error) {
		changed, err := outboxOf(r).Writer.Resume(ctx, typ)
		return one(changed), err
	}, "/")
}

// one is the count of an action on one type: 1 when it changed it.
func one(changed bool) int {
	if changed {
		return 1
	}
	return 0
}

// act runs an action audited whatever happens: its intent is recorded
// before it changes anything (an intent that cannot be recorded stops
// it), the count it reaches is written as it goes, and the record is
// completed with the real count and how it ended, done, failed or
// cancelled, on a context the request's end does not cancel. do gets
// the record's id, with which it stamps every event it changes; an
// action that did not end well is recounted by that stamp, for a write
// that failed may have changed some events all the same. Then the
// browser goes to next, or is told what went wrong.
func (c *Console) act(w http.ResponseWriter, r *http.Request, a mongo.Action, do func(ctx context.Context, audit bson.ObjectID, progress func(int)) (int, error), next string) {
	reason, err := reasonOf(r)
	if err != nil {
		c.refuse(w, r, err)
		return
	}
	o := outboxOf(r)
	a.Reason, a.At, a.By, a.Source, a.From, a.Outbox = reason, c.now(r), actor(r), "console", requesterOf(r).from, o.Name
	if a.Planned == 0 {
		a.Planned = len(a.IDs)
	}
	if why := c.mayAct(r, a.Name, max(a.Planned, 1)); why != "" {
		c.refuse(w, r, errForbidden{why})
		return
	}
	if !c.actions.allow(cmp.Or(requesterOf(r).credential, a.By)) {
		c.refuse(w, r, errTooMany{fmt.Sprintf("%s started more than %d actions in a minute: nothing was done; wait a minute", a.By, c.cfg.ActionsPerMinute)})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.ActionTimeout)
	defer cancel()
	r = r.WithContext(ctx)
	id, err := o.Writer.StartAction(r.Context(), a)
	if err != nil {
		c.refuse(w, r, fmt.Errorf("nothing was done: the audit record of the %s could not be written: %w", a.Name, err))
		return
	}
	keep := context.WithoutCancel(r.Context())
	progress := func(done int) {
		// Within the action's deadline, each write briefly: the record's
		// end, written after, has the count in any case.
		ctx, cancel := context.WithTimeout(r.Context(), progressTimeout)
		defer cancel()
		if err := o.Writer.ProgressAction(ctx, id, done); err != nil {
			c.cfg.Logger.Warn("console action's progress not recorded", "action", a.Name, "count", done, "error", err)
		}
	}
	n, err := do(r.Context(), id, progress)
	state := mongo.ActionDone
	switch {
	case err != nil && errors.Is(r.Context().Err(), context.DeadlineExceeded):
		state = mongo.ActionFailed
		err = fmt.Errorf("stopped after %s (ActionTimeout): %w", c.cfg.ActionTimeout, err)
	case err != nil && r.Context().Err() != nil:
		state = mongo.ActionCancelled
	case err != nil:
		state = mongo.ActionFailed
	}
	endCtx, cancel := context.WithTimeout(keep, auditTimeout)
	defer cancel()
	if err != nil && len(a.IDs) > 0 {
		n, err = c.recount(endCtx, o.Writer, id, a, n, err)
	}
	if n > 0 && o.Lists != nil && (a.Name == "requeue" || a.Name == "skip" || a.Name == "discard") {
		// The kept lists are out of date: read at each view until the
		// source has read them again, which it does soon.
		o.acted.Store(c.now(r).UnixNano())
		o.Lists.Trigger()
	}
	if ferr := o.Writer.FinishAction(endCtx, id, state, n, errText(err), c.now(r)); ferr != nil {
		ferr = fmt.Errorf("the %s changed %d events, but its audit record was not completed (it says started): %w", a.Name, n, ferr)
		err = errors.Join(err, ferr)
	}
	if err != nil {
		c.refuse(w, r, err)
		return
	}
	logger := c.cfg.Logger
	if o.Name != "" {
		logger = logger.With("outbox", o.Name)
	}
	logger.Info("console action", "action", a.Name, "target", a.Target, "count", n, "by", a.By, "from", a.From, "reason", a.Reason)
	http.Redirect(w, r, c.baseOf(o)+next, http.StatusSeeOther)
}

// recount counts the events an action that did not end well changed by
// its stamp: its write may have changed events and still answered an
// error. The audit then records that count, and says it was recounted.
func (c *Console) recount(ctx context.Context, w Writer, id bson.ObjectID, a mongo.Action, n int, err error) (int, error) {
	touched, rerr := w.Touched(ctx, id, a.IDs)
	if rerr != nil {
		return n, errors.Join(err, fmt.Errorf("not recounted: %w", rerr))
	}
	return len(touched), fmt.Errorf("%w; applied to %d of the %d events (recounted by this action's stamp)", err, len(touched), a.Planned)
}

// refuse answers an action that was not done, or not wholly, with why.
func (c *Console) refuse(w http.ResponseWriter, r *http.Request, err error) {
	c.cfg.Logger.Warn("console action failed", "path", r.URL.Path, "by", actor(r), "error", err)
	l := c.layoutOf(r)
	l.Title, l.Page, l.Error = "Not done", "error", err.Error()
	c.render(w, status(err), "event", l)
}

// audit lists the last actions, newest first.
func (c *Console) audit(r *http.Request) (any, error) {
	actions, err := outboxOf(r).Store.Actions(r.Context(), auditShown)
	if err != nil {
		return nil, err
	}
	if actions == nil {
		actions = []mongo.Action{}
	}
	return actions, nil
}

// AuditRecord is one action's page: its record, and the ids of every
// event it changed, read back from the events by its stamp.
type AuditRecord struct {
	Action mongo.Action `json:"action"`
	// Touched are the events that carry the action's stamp, oldest
	// first: all those it changed (none for a pause or resume, or a
	// record of the CLI).
	Touched []string `json:"touched"`
	// Planned are the events it set out to change.
	Planned int `json:"planned"`
}

// auditRecord reads one action and the events it changed.
func (c *Console) auditRecord(r *http.Request) (any, error) {
	id, err := bson.ObjectIDFromHex(r.PathValue("id"))
	if err != nil {
		return nil, errNotFound{"no action " + strconv.Quote(r.PathValue("id")) + ": an action's id is 24 hex digits"}
	}
	a, err := outboxOf(r).Store.ActionByID(r.Context(), id)
	if errors.Is(err, mongo.ErrNoAction) {
		return nil, errNotFound{err.Error()}
	}
	if err != nil {
		return nil, err
	}
	touched, err := outboxOf(r).Store.Touched(r.Context(), id, a.IDs)
	if err != nil {
		return nil, err
	}
	rec := AuditRecord{Action: a, Touched: make([]string, 0, len(touched)), Planned: a.Planned}
	for _, t := range touched {
		rec.Touched = append(rec.Touched, anyIDText(t))
	}
	return rec, nil
}

// canRequeue reports whether an event's page offers its requeue and skip.
func canRequeue(status string) bool { return status == string(events.StatusFailed) }
