package console

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// Writer changes the outbox as the console's actions ask (mongo.Store).
type Writer interface {
	Requeue(ctx context.Context, f mongo.RequeueFilter, dryRun bool) (int, error)
	Skip(ctx context.Context, ids []string, by, reason string, at time.Time, dryRun bool) (int, error)
	RecordAction(ctx context.Context, a mongo.Action) error
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
)

// authorized reports whether r gives the console's token as the password
// of HTTP Basic authentication, and the user name it gives, which the
// audit records as who acted. Tokens are compared by their SHA-256
// digests, so that the comparison's time tells nothing of the token.
func (c *Console) authorized(r *http.Request) (string, bool) {
	user, pass, ok := r.BasicAuth()
	if !ok {
		return "", false
	}
	sent := sha256.Sum256([]byte(pass))
	return user, subtle.ConstantTimeCompare(sent[:], c.token[:]) == 1
}

// sameOrigin reports whether a request that changes something comes from
// the console's own pages: a browser says where a request comes from
// (Sec-Fetch-Site, Origin), and a page of another site that makes the
// operator's browser post here, credentials and all, is refused. A client
// that is no browser sends neither, and had to give the token.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return false
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	return err == nil && u.Host == r.Host
}

// actor is who acts: the user name of the request's authentication, or
// "console" when it gave none.
func actor(r *http.Request) string {
	if user, _, ok := r.BasicAuth(); ok && strings.TrimSpace(user) != "" {
		return strings.TrimSpace(user)
	}
	return "console"
}

// reasonOf is the form's reason, required: every action says why.
func reasonOf(r *http.Request) (string, error) {
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if reason == "" {
		return "", errBadRequest{"a reason is required: say why, for the audit"}
	}
	return reason, nil
}

// requeueEvent requeues one FAILED event.
func (c *Console) requeueEvent(w http.ResponseWriter, r *http.Request) {
	c.act(w, r, func(reason string) (mongo.Action, error) {
		id := r.PathValue("id")
		n, err := c.cfg.Writer.Requeue(r.Context(), mongo.RequeueFilter{IDs: []string{id}}, false)
		return mongo.Action{Name: "requeue", Target: "ids: " + id, Count: n, Reason: reason}, err
	}, "/events/"+url.PathEscape(r.PathValue("id")))
}

// skipEvent marks one FAILED event skipped.
func (c *Console) skipEvent(w http.ResponseWriter, r *http.Request) {
	c.act(w, r, func(reason string) (mongo.Action, error) {
		id := r.PathValue("id")
		n, err := c.cfg.Writer.Skip(r.Context(), []string{id}, actor(r), reason, c.cfg.Now(), false)
		return mongo.Action{Name: "skip", Target: "ids: " + id, Count: n, Reason: reason}, err
	}, "/events/"+url.PathEscape(r.PathValue("id")))
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
// record, and nothing is recorded.
func (c *Console) pauseType(w http.ResponseWriter, r *http.Request) {
	c.act(w, r, func(reason string) (mongo.Action, error) {
		typ, err := typeOf(r, "pause")
		if err != nil {
			return mongo.Action{}, err
		}
		changed, err := c.cfg.Writer.Pause(r.Context(), events.Pause{Type: typ, By: actor(r), Reason: reason, At: c.cfg.Now()})
		return mongo.Action{Name: "pause", Target: "type: " + typ, Count: one(changed), Reason: reason}, err
	}, "/")
}

// resumeType resumes the form's event type.
func (c *Console) resumeType(w http.ResponseWriter, r *http.Request) {
	c.act(w, r, func(reason string) (mongo.Action, error) {
		typ, err := typeOf(r, "resume")
		if err != nil {
			return mongo.Action{}, err
		}
		changed, err := c.cfg.Writer.Resume(r.Context(), typ)
		return mongo.Action{Name: "resume", Target: "type: " + typ, Count: one(changed), Reason: reason}, err
	}, "/")
}

// one is the count of an action on one type: 1 when it changed it.
func one(changed bool) int {
	if changed {
		return 1
	}
	return 0
}

// Confirm is the data of the page that asks to confirm a group's requeue.
type Confirm struct {
	Cause     string `json:"cause"`
	Count     int    `json:"count"`
	PerSecond int    `json:"perSecond"`
}

// confirmRequeue counts the FAILED events of a cause, for the page that
// asks to confirm their requeue.
func (c *Console) confirmRequeue(r *http.Request) (any, error) {
	cause := r.URL.Query().Get("cause")
	if cause == "" {
		return nil, errBadRequest{"cause is required: open this page from the failures page"}
	}
	n, err := c.cfg.Writer.Requeue(r.Context(), mongo.RequeueFilter{ErrorPattern: causePattern(cause)}, true)
	if err != nil {
		return nil, err
	}
	return Confirm{Cause: cause, Count: n, PerSecond: c.cfg.RequeuePerSecond}, nil
}

// requeueCause requeues the FAILED events of a cause, spread over time,
// once the operator confirmed the count the confirmation page showed. A
// count that changed since is asked again: the group is not what was
// confirmed.
func (c *Console) requeueCause(w http.ResponseWriter, r *http.Request) {
	cause := r.PostFormValue("cause")
	c.act(w, r, func(reason string) (mongo.Action, error) {
		confirmed, err := strconv.Atoi(r.PostFormValue("count"))
		if err != nil || cause == "" {
			return mongo.Action{}, errBadRequest{"cause and count are required: confirm from the confirmation page"}
		}
		f := mongo.RequeueFilter{ErrorPattern: causePattern(cause), PerSecond: c.cfg.RequeuePerSecond, Now: c.cfg.Now()}
		now, err := c.cfg.Writer.Requeue(r.Context(), f, true)
		if err != nil {
			return mongo.Action{}, err
		}
		if now != confirmed {
			return mongo.Action{}, errBadRequest{fmt.Sprintf("the group has %d events now, not the %d confirmed: nothing was requeued; confirm again", now, confirmed)}
		}
		n, err := c.cfg.Writer.Requeue(r.Context(), f, false)
		return mongo.Action{Name: "requeue", Target: "cause: " + cause, Count: n, Reason: reason}, err
	}, "/audit")
}

// act runs an action and records it, then sends the browser to next. An
// action that changed nothing is not recorded.
func (c *Console) act(w http.ResponseWriter, r *http.Request, do func(reason string) (mongo.Action, error), next string) {
	reason, err := reasonOf(r)
	var a mongo.Action
	if err == nil {
		a, err = do(reason)
	}
	if err == nil && a.Count > 0 {
		a.At, a.By, a.Source = c.cfg.Now(), actor(r), "console"
		if err = c.cfg.Writer.RecordAction(r.Context(), a); err != nil {
			err = fmt.Errorf("the %s of %d events is done, but its audit record was not written: %w", a.Name, a.Count, err)
		}
	}
	if err != nil {
		c.cfg.Logger.Warn("console action failed", "path", r.URL.Path, "by", actor(r), "error", err)
		c.render(w, status(err), "event", layout{Title: "Not done", Page: "error", Base: c.cfg.BasePath, Error: err.Error(), Writes: c.writes()})
		return
	}
	c.cfg.Logger.Info("console action", "action", a.Name, "target", a.Target, "count", a.Count, "by", a.By, "reason", a.Reason)
	http.Redirect(w, r, c.cfg.BasePath+next, http.StatusSeeOther)
}

// audit lists the last actions, newest first.
func (c *Console) audit(r *http.Request) (any, error) {
	actions, err := c.cfg.Store.Actions(r.Context(), auditShown)
	if err != nil {
		return nil, err
	}
	if actions == nil {
		actions = []mongo.Action{}
	}
	return actions, nil
}

// canRequeue reports whether an event's page offers its requeue and skip.
func canRequeue(status string) bool { return status == string(events.StatusFailed) }
