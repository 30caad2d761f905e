package console

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ops"
)

// A bulk action is previewed, then done: the preview page lists the
// events it will touch, and the form it shows carries exactly those _ids
// back, so the action changes them and no other, whatever failed or was
// skipped since. Skipped events are never selected (mongo.Selection).

// previewShown is how many ids a preview lists.
const previewShown = 20

// Preview is the data of the page that shows what an action will touch
// and asks to confirm it.
type Preview struct {
	// Action is requeue or skip.
	Action string `json:"action"`
	// Target says how the events were chosen: a failure group, ids.
	Target string `json:"target"`
	// Total is how many events the choice matches now; Count how many
	// the action touches, the oldest Max of them.
	Total int `json:"total"`
	Count int `json:"count"`
	// IDs are the first ids of the selection, oldest first.
	IDs []string `json:"ids"`
	// Selection is the selection as the form posts it back: opaque.
	Selection string `json:"selection"`
	PerSecond int    `json:"perSecond"`
	Max       int    `json:"max"`
	// Query is the choice, to preview the rest once this is done.
	Query string `json:"-"`
}

// selectionOf reads the choice of events of a preview's query: a failure
// group (cause and reason) or ids.
func selectionOf(q url.Values) (mongo.Selection, string, error) {
	switch {
	case q.Has("cause"):
		g := mongo.Group{Cause: q.Get("cause"), Reason: q.Get("reason")}
		return mongo.Selection{Group: &g}, fmt.Sprintf("cause: %s; reason: %s", g.Cause, g.Reason), nil
	case len(q["id"]) > 0:
		return mongo.Selection{IDs: q["id"]}, "ids: " + listed(q["id"]), nil
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

// preview selects the events an action would touch, at most Config.ActionMax.
func (c *Console) preview(ctx context.Context, action string, q url.Values) (Preview, error) {
	sel, target, err := selectionOf(q)
	if err != nil {
		return Preview{}, err
	}
	if sel.Group != nil {
		// A group is chosen by its stored cause: the events that failed
		// since the groups were read get theirs first. Quietly: the
		// preview says what it finds.
		if _, err := c.cfg.Writer.ClassifyFailed(ctx, ops.FailureGroupsLimit); err != nil {
			c.cfg.Logger.Warn("console could not store the causes of FAILED events", "error", err)
		}
	}
	ids, total, err := c.cfg.Writer.Select(ctx, sel, c.cfg.ActionMax)
	if err != nil {
		return Preview{}, err
	}
	encoded, err := encodeSelection(ids)
	if err != nil {
		return Preview{}, err
	}
	p := Preview{
		Action: action, Target: target, Total: total, Count: len(ids), IDs: []string{}, Selection: encoded,
		PerSecond: c.cfg.RequeuePerSecond, Max: c.cfg.ActionMax, Query: q.Encode(),
	}
	for _, id := range ids[:min(len(ids), previewShown)] {
		p.IDs = append(p.IDs, anyIDText(id))
	}
	return p, nil
}

// confirmRequeue previews a requeue.
func (c *Console) confirmRequeue(r *http.Request) (any, error) {
	return c.preview(r.Context(), "requeue", r.URL.Query())
}

// requeueSelection requeues the events of a preview, spread over time,
// oldest first. An event skipped or requeued since the preview is left
// alone; one that failed since is not in it.
func (c *Console) requeueSelection(w http.ResponseWriter, r *http.Request) {
	ids, err := c.selectionPosted(r)
	if err != nil {
		c.refuse(w, r, err)
		return
	}
	a := mongo.Action{Name: "requeue", Target: c.postedTarget(r, ids)}
	c.act(w, r, a, func(ctx context.Context, progress func(int)) (int, error) {
		return c.cfg.Writer.Requeue(ctx, mongo.RequeueFilter{
			Selected: ids, PerSecond: c.cfg.RequeuePerSecond, Now: c.cfg.Now(), Progress: progress,
		}, false)
	}, "/audit")
}

// confirmSkip previews a skip.
func (c *Console) confirmSkip(r *http.Request) (any, error) {
	return c.preview(r.Context(), "skip", r.URL.Query())
}

// skipSelection marks the events of a preview skipped: their aggregates'
// later events flow. One skipped or requeued since is left alone.
func (c *Console) skipSelection(w http.ResponseWriter, r *http.Request) {
	ids, err := c.selectionPosted(r)
	if err != nil {
		c.refuse(w, r, err)
		return
	}
	c.act(w, r, mongo.Action{Name: "skip", Target: c.postedTarget(r, ids)}, func(ctx context.Context, _ func(int)) (int, error) {
		return c.cfg.Writer.SkipSelected(ctx, ids, actor(r), reasonValue(r), c.cfg.Now())
	}, "/audit")
}

// selectionPosted is the selection a preview's form posted, bounded by
// Config.ActionMax.
func (c *Console) selectionPosted(r *http.Request) ([]any, error) {
	ids, err := decodeSelection(r.PostFormValue("selection"))
	if err != nil {
		return nil, err
	}
	if len(ids) > c.cfg.ActionMax {
		return nil, errBadRequest{fmt.Sprintf("%d events selected, more than the %d one action may touch (ActionMax)", len(ids), c.cfg.ActionMax)}
	}
	return ids, nil
}

// postedTarget says, for the audit, how the posted selection was chosen
// and which events it holds.
func (c *Console) postedTarget(r *http.Request, ids []any) string {
	texts := make([]string, 0, min(len(ids), previewShown+1))
	for _, id := range ids[:min(len(ids), previewShown)] {
		texts = append(texts, anyIDText(id))
	}
	s := fmt.Sprintf("%d previewed: ids: %s", len(ids), strings.Join(texts, ", "))
	if from := r.PostFormValue("target"); from != "" {
		s = fmt.Sprintf("%d previewed, chosen by %s: ids: %s", len(ids), from, strings.Join(texts, ", "))
	}
	if len(ids) > previewShown {
		s += fmt.Sprintf(" and %d more", len(ids)-previewShown)
	}
	return s
}

// selectionDoc is a selection as its form carries it.
type selectionDoc struct {
	IDs []any `bson:"ids"`
}

// encodeSelection writes ids, as stored (strings, ObjectIDs or other
// types), so that decodeSelection gives them back exactly.
func encodeSelection(ids []any) (string, error) {
	b, err := bson.Marshal(selectionDoc{IDs: ids})
	if err != nil {
		return "", fmt.Errorf("encode the selection: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// decodeSelection reads a selection encodeSelection wrote.
func decodeSelection(s string) ([]any, error) {
	bad := errBadRequest{"no selection of this console's preview was posted: preview the action again"}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || s == "" || bson.Raw(b).Validate() != nil {
		return nil, bad
	}
	var d selectionDoc
	if err := bson.Unmarshal(b, &d); err != nil || len(d.IDs) == 0 {
		return nil, bad
	}
	return d.IDs, nil
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
