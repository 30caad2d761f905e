package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/mongo"
)

// A bulk action is previewed, then done: the preview page lists the
// events it will touch, and the console holds exactly their _ids under
// a random id (previewBook); the form posts that id alone, so the action
// changes them and no other, whatever failed or was skipped since.
// Skipped events are never selected (mongo.Selection).

// previewShown is how many ids a preview lists.
const previewShown = 20

// Preview is the data of the page that shows what an action will touch
// and asks to confirm it.
type Preview struct {
	// Action is requeue, skip or discard.
	Action string `json:"action"`
	// Target says how the events were chosen: a failure group, ids.
	Target string `json:"target"`
	// Total is how many events the choice matches now; Count how many
	// the action touches, the oldest Max of them.
	Total int `json:"total"`
	Count int `json:"count"`
	// IDs are the first ids of the selection, oldest first.
	IDs []string `json:"ids"`
	// ID names the preview the console holds: the confirming POST sends
	// it as "preview", and nothing else of the selection. "" when the
	// preview selects nothing.
	ID string `json:"preview,omitempty"`
	// Expires is when the console forgets the preview.
	Expires   time.Time `json:"expires,omitzero"`
	PerSecond int       `json:"perSecond"`
	Max       int       `json:"max"`
	// Query is the choice, to preview the rest once this is done.
	Query string `json:"-"`
}

// selectionOf reads the choice of events of a preview's query: a failure
// group (cause and reason) or ids, no more of them than one action may
// touch; it asks the store nothing.
func (c *Console) selectionOf(q url.Values) (mongo.Selection, string, error) {
	switch {
	case q.Has("cause"):
		g := mongo.Group{Cause: q.Get("cause"), Reason: q.Get("reason")}
		return mongo.Selection{Group: &g}, fmt.Sprintf("cause: %s; reason: %s", g.Cause, g.Reason), nil
	case len(q["id"]) > 0:
		if len(q["id"]) > c.cfg.ActionMax {
			return mongo.Selection{}, "", errBadRequest{fmt.Sprintf("%d ids chosen, more than the %d one action may touch (ActionMax): choose fewer", len(q["id"]), c.cfg.ActionMax)}
		}
		ids := make([]string, 0, len(q["id"]))
		for _, id := range q["id"] {
			if id != "" && !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			break
		}
		return mongo.Selection{IDs: ids}, "ids: " + listed(ids), nil
	}
	return mongo.Selection{}, "", errBadRequest{"choose the events: open this page from the failures page or the events list"}
}

// listed is the first ids of a list, and how many more.
func listed(ids []string) string {
	s := strings.Join(ids[:min(len(ids), previewShown)], ", ")
	if len(ids) > previewShown {
		s += fmt.Sprintf(" and %d more", len(ids)-previewShown)
	}
	return s
}

// preview selects the events an action would touch, at most
// Config.ActionMax, and holds them for the user who asked. It writes
// nothing to the database: a group is chosen by the causes stored by
// the sampler's or the failures page's read, and an event that failed
// since is left for the next preview.
func (c *Console) preview(r *http.Request, action string) (Preview, error) {
	q := r.URL.Query()
	sel, target, err := c.selectionOf(q)
	if err != nil {
		return Preview{}, err
	}
	ids, total, err := outboxOf(r).Writer.Select(r.Context(), sel, c.cfg.ActionMax)
	if err != nil {
		return Preview{}, err
	}
	ids = ids[:min(len(ids), c.cfg.ActionMax)]
	if why := c.mayAct(r, action, len(ids)); why != "" {
		return Preview{}, errForbidden{why}
	}
	p := Preview{
		Action: action, Target: target, Total: total, Count: len(ids), IDs: []string{},
		PerSecond: c.cfg.RequeuePerSecond, Max: c.cfg.ActionMax, Query: q.Encode(),
	}
	for _, id := range ids[:min(len(ids), previewShown)] {
		p.IDs = append(p.IDs, anyIDText(id))
	}
	if len(ids) > 0 {
		held := heldPreview{user: actor(r), action: action, outbox: outboxOf(r).Name, ids: ids, target: target}
		p.ID, p.Expires = c.previews.hold(held)
	}
	return p, nil
}

// confirmRequeue previews a requeue.
func (c *Console) confirmRequeue(r *http.Request) (any, error) {
	return c.preview(r, "requeue")
}

// requeueSelection requeues the events of a preview, spread over time,
// oldest first. An event skipped or requeued since the preview is left
// alone; one that failed since is not in it.
func (c *Console) requeueSelection(w http.ResponseWriter, r *http.Request) {
	p, err := c.previewPosted(r, "requeue")
	if err != nil {
		c.refuse(w, r, err)
		return
	}
	a := mongo.Action{Name: "requeue", Target: heldTarget(p), IDs: p.ids}
	c.act(w, r, a, func(ctx context.Context, audit bson.ObjectID, progress func(int)) (int, error) {
		return outboxOf(r).Writer.Requeue(ctx, mongo.RequeueFilter{
			Selected: p.ids, PerSecond: c.cfg.RequeuePerSecond, Now: c.now(r), Progress: progress, Action: audit,
		}, false)
	}, "/audit")
}

// confirmSkip previews a skip.
func (c *Console) confirmSkip(r *http.Request) (any, error) {
	return c.preview(r, "skip")
}

// skipSelection marks the events of a preview skipped: their aggregates'
// later events flow. One skipped or requeued since is left alone.
func (c *Console) skipSelection(w http.ResponseWriter, r *http.Request) {
	p, err := c.previewPosted(r, "skip")
	if err != nil {
		c.refuse(w, r, err)
		return
	}
	a := mongo.Action{Name: "skip", Target: heldTarget(p), IDs: p.ids}
	c.act(w, r, a, func(ctx context.Context, audit bson.ObjectID, _ func(int)) (int, error) {
		return outboxOf(r).Writer.SkipSelected(ctx, p.ids, actor(r), reasonValue(r), c.now(r), audit)
	}, "/audit")
}

// confirmDiscard previews a discard, an admin's only (mayAct).
func (c *Console) confirmDiscard(r *http.Request) (any, error) {
	return c.preview(r, "discard")
}

// discardSelection discards the events of a preview: kept, skipped, and
// never requeued. The form must say so again (its box checked), before
// the preview is used up.
func (c *Console) discardSelection(w http.ResponseWriter, r *http.Request) {
	if r.PostFormValue("confirm") != "discard" {
		c.refuse(w, r, errBadRequest{"a discard cannot be undone: confirm it on the preview"})
		return
	}
	p, err := c.previewPosted(r, "discard")
	if err != nil {
		c.refuse(w, r, err)
		return
	}
	a := mongo.Action{Name: "discard", Target: heldTarget(p), IDs: p.ids}
	c.act(w, r, a, func(ctx context.Context, audit bson.ObjectID, _ func(int)) (int, error) {
		return outboxOf(r).Writer.DiscardSelected(ctx, p.ids, actor(r), reasonValue(r), c.now(r), audit)
	}, "/audit")
}

// previewPosted is the held preview a confirming form names, when the
// user who posts it holds it for action and it has not expired. It is
// used once.
func (c *Console) previewPosted(r *http.Request, action string) (heldPreview, error) {
	if reasonValue(r) == "" {
		// Checked again by act; checked here too so that a form sent
		// without a reason does not use up its preview.
		return heldPreview{}, errBadRequest{"a reason is required: say why, for the audit"}
	}
	p, ok := c.previews.take(r.PostFormValue("preview"), actor(r), action, outboxOf(r).Name)
	if !ok {
		return heldPreview{}, errBadRequest{"no preview of this " + action + " of this outbox is held for you (unknown, expired, used, another user's or another outbox's): preview the action again"}
	}
	return p, nil
}

// heldTarget says, for the audit, how a held preview chose its events
// and which they are, from what the console held, never from the form.
func heldTarget(p heldPreview) string {
	texts := make([]string, 0, min(len(p.ids), previewShown))
	for _, id := range p.ids[:min(len(p.ids), previewShown)] {
		texts = append(texts, anyIDText(id))
	}
	s := fmt.Sprintf("%d previewed, chosen by %s: ids: %s", len(p.ids), p.target, strings.Join(texts, ", "))
	if len(p.ids) > previewShown {
		s += fmt.Sprintf(" and %d more (all in the record)", len(p.ids)-previewShown)
	}
	return s
}

// anyIDText is an _id as mongo.IDText writes it.
func anyIDText(id any) string {
	switch v := id.(type) {
	case bson.ObjectID:
		return v.Hex()
	case string:
		return v
	}
	return fmt.Sprint(id)
}
