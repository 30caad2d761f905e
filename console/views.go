package console

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
	"github.com/outboxrelay/outbox/ops"
	"github.com/outboxrelay/outbox/ownership"
)

// Overview is the overview page's data.
type Overview struct {
	// SampledAt is when the counts were taken, by the database's clock;
	// zero before the first sample.
	SampledAt time.Time        `json:"sampledAt,omitzero"`
	Counts    map[string]int64 `json:"counts"`
	// OldestNewAgeSeconds is how long the oldest NEW event has waited.
	OldestNewAgeSeconds float64 `json:"oldestNewAgeSeconds"`
	StaleProcessing     int64   `json:"staleProcessing"`
	// HeldAggregates is nil where the sampler does not read them
	// (ordering off).
	HeldAggregates *int64    `json:"heldAggregates,omitempty"`
	Replicas       []Replica `json:"replicas"`
	// Leader is the replica that samples the gauges for all; "" while
	// none leads.
	Leader string `json:"leader"`
	// Unowned counts the partitions no live replica owns.
	Unowned int `json:"unownedPartitions"`
	// PausedTypes are the event types an operator paused, by type.
	PausedTypes []events.Pause `json:"pausedTypes"`
}

// Replica is one worker seen in the owners collection.
type Replica struct {
	WorkerID   string    `json:"workerId"`
	LastSeen   time.Time `json:"lastSeen,omitzero"`
	Partitions []int     `json:"partitions"`
	Live       bool      `json:"live"`
}

// EventRow is one event of a list.
type EventRow struct {
	ID            string    `json:"id"`
	Type          string    `json:"type"`
	AggregateType string    `json:"aggregateType,omitempty"`
	AggregateID   string    `json:"aggregateId,omitempty"`
	Status        string    `json:"status"`
	CreatedAt     time.Time `json:"createdAt,omitzero"`
	Attempts      int64     `json:"attempts"`
	LastError     string    `json:"lastError,omitempty"`
	RetryAt       time.Time `json:"retryAt,omitzero"`
	FailedAt      time.Time `json:"failedAt,omitzero"`
	Skipped       bool      `json:"skipped,omitempty"`
	// Discarded is an event an operator discarded: skipped for good, never
	// requeued.
	Discarded bool `json:"discarded,omitempty"`
}

// EventList is the events page's data.
type EventList struct {
	Status string `json:"status"`
	// At is when the events were read, where the FAILED list's first
	// page comes from the failure groups' read (Config.Lists); zero when
	// read for this view.
	At     time.Time  `json:"at,omitzero"`
	Events []EventRow `json:"events"`
	// Next is the cursor of the next page; "" on the last.
	Next string `json:"next,omitempty"`
}

// EventDetail is one event's page data.
type EventDetail struct {
	EventRow
	// Document is the stored document as relaxed Extended JSON.
	Document string                `json:"document"`
	History  []events.AttemptError `json:"attemptHistory"`
	// LaterPublished is, for a skipped FAILED event, how many later
	// events of its aggregate are already published (at most
	// laterPublishedMax): a requeue publishes it after them.
	LaterPublished int `json:"laterPublished,omitempty"`
}

// laterPublishedMax bounds the count of a skipped event's later
// published events: past it the page says "or more".
const laterPublishedMax = 1000

// FailureGroup is the FAILED events of one cause.
type FailureGroup = events.FailureGroup

// Failures is the failures page's data: the groups, when they were
// read, how many FAILED events they hold and whether there were more.
type Failures = events.FailureGroups

// HeldAggregate is an aggregate whose later events wait behind Holder.
type HeldAggregate struct {
	Key    string   `json:"aggregate"` // "<aggregateType>/<aggregateId>"
	Holder EventRow `json:"holder"`
	// Why says why the holder holds: FAILED, or backing off until its
	// retryAt.
	Why string `json:"why"`
}

// Held is the held page's data.
type Held struct {
	// At is when the holders were read, where the console's sampler
	// keeps them (Config.Lists); zero when read for this view.
	At         time.Time       `json:"at,omitzero"`
	Aggregates []HeldAggregate `json:"aggregates"`
	Capped     bool            `json:"capped,omitempty"`
	// PausedTypes are the event types an operator paused, by type: with
	// ordering, each NEW event of one holds its aggregate.
	PausedTypes []events.Pause `json:"pausedTypes"`
}

func (c *Console) overview(r *http.Request) (any, error) {
	ov := Overview{Counts: map[string]int64{}}
	if s, ok := outboxOf(r).Samples.Latest(); ok {
		ov.SampledAt = s.At
		for st, n := range s.Stats.Counts {
			ov.Counts[string(st)] = n
		}
		ov.OldestNewAgeSeconds = s.Stats.OldestNewAge(s.At).Seconds()
		ov.StaleProcessing = s.Stats.Stale
		if s.Held != nil {
			ov.HeldAggregates = &s.Held.Aggregates
		}
	}
	now := c.now(r)
	var err error
	// Read at each view, not sampled: a pause shows at once.
	if ov.PausedTypes, err = outboxOf(r).Store.PausedTypes(r.Context()); err != nil {
		return nil, err
	}
	if outboxOf(r).Owners != nil {
		terms, members, err := outboxOf(r).Owners.Read(r.Context())
		if err != nil {
			return nil, fmt.Errorf("read the partitions' owners: %w", err)
		}
		ov.Replicas, ov.Leader, ov.Unowned = replicas(terms, members, now, outboxOf(r).TermLength)
	}
	return ov, nil
}

// Published is the publish chart's data: the events published in each
// minute of the last hour, oldest minute first. The overview draws it
// from /api/published once it is shown: on a database that cannot count
// them from an index (FerretDB) the count reads the hour's PUBLISHED
// events, and the overview must not wait for that.
type Published struct {
	PerMinute []int64 `json:"publishedPerMinute"`
	// Unavailable says why there is no chart, where the database would
	// read the whole PUBLISHED history for it (mongo.ErrNoPublishChart).
	Unavailable string `json:"unavailable,omitempty"`
}

func (c *Console) published(r *http.Request) (any, error) {
	now := c.now(r)
	counts, err := outboxOf(r).Store.PublishedPerMinute(r.Context(), now.Add(-59*time.Minute), now)
	if errors.Is(err, mongo.ErrNoPublishChart) {
		return Published{PerMinute: []int64{}, Unavailable: err.Error()}, nil
	}
	if err != nil {
		return nil, err
	}
	return Published{PerMinute: counts}, nil
}

// replicas groups the live terms by owner, with each member's last
// heartbeat; the leader is the owner of ownership.LeaderPartition.
func replicas(terms []ownership.Term, members []ownership.Member, now time.Time, termLength time.Duration) ([]Replica, string, int) {
	byID := map[string]*Replica{}
	get := func(id string) *Replica {
		if byID[id] == nil {
			byID[id] = &Replica{WorkerID: id, Partitions: []int{}}
		}
		return byID[id]
	}
	for _, m := range members {
		r := get(m.WorkerID)
		r.LastSeen = m.SeenAt
		r.Live = now.Sub(m.SeenAt) <= termLength
	}
	leader, owned := "", 0
	for p, t := range ownership.Latest(terms) {
		if t.Released || now.After(t.ExpiresAt) {
			continue
		}
		r := get(t.Owner)
		r.Partitions = append(r.Partitions, p)
		r.Live = true
		owned++
		if p == ownership.LeaderPartition {
			leader = t.Owner
		}
	}
	out := make([]Replica, 0, len(byID))
	for _, r := range byID {
		slices.Sort(r.Partitions)
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b Replica) int { return cmp.Compare(a.WorkerID, b.WorkerID) })
	return out, leader, events.Partitions - owned
}

// errorSearchMax bounds the text searched in lastError.
const errorSearchMax = 200

// filtered reports whether an events list's query narrows or pages it:
// such a list is read at each view (not kept by the sampler), so it is
// not refreshed.
func filtered(q url.Values) bool {
	for _, k := range []string{"type", "aggregate", "error", "cause", "reason", "olderThan", "after"} {
		if q.Get(k) != "" {
			return true
		}
	}
	return false
}

// listStatuses are the statuses the events page lists.
var listStatuses = []events.Status{events.StatusFailed, events.StatusNew, events.StatusProcessing, events.StatusPublished, events.StatusUnknown}

func (c *Console) events(r *http.Request) (any, error) {
	q := r.URL.Query()
	status := events.Status(cmp.Or(q.Get("status"), string(events.StatusFailed)))
	if !slices.Contains(listStatuses, status) {
		return nil, errBadRequest{fmt.Sprintf("status %q: want FAILED, NEW, PROCESSING, PUBLISHED or unknown", status)}
	}
	if text := q.Get("error"); text != "" && status != events.StatusFailed {
		return nil, errBadRequest{fmt.Sprintf("error: the search of lastError is only on FAILED events (status %s): it runs over every event of its status", status)}
	} else if len(text) > errorSearchMax {
		return nil, errBadRequest{fmt.Sprintf("error: at most %d characters (got %d)", errorSearchMax, len(text))}
	}
	eq := mongo.EventQuery{
		Status: status, Type: q.Get("type"), AggregateID: q.Get("aggregate"), ErrorText: q.Get("error"),
		Limit: c.cfg.PageSize,
	}
	if q.Has("cause") {
		// The failures page's link to a group: the events whose stored
		// cause and reason are these, compared as text.
		eq.Group = &mongo.Group{Cause: q.Get("cause"), Reason: q.Get("reason")}
	}
	if age := q.Get("olderThan"); age != "" {
		d, err := time.ParseDuration(age)
		if err != nil || d < 0 {
			return nil, errBadRequest{fmt.Sprintf("olderThan %q: want a duration such as 10m or 2h", age)}
		}
		eq.CreatedBefore = c.now(r).Add(-d)
	}
	if after := q.Get("after"); after != "" {
		mark, err := decodeMark(after)
		if err != nil {
			return nil, errBadRequest{fmt.Sprintf("after: %v", err)}
		}
		eq.After = mark
	}
	// The FAILED list's first page comes from the failure groups' read
	// where it is kept; every other page is read now.
	docs, next, at, kept := keptFailedPage(outboxOf(r), eq)
	if !kept {
		var err error
		if docs, next, err = outboxOf(r).Store.ListEvents(r.Context(), eq); err != nil {
			return nil, err
		}
	}
	list := EventList{Status: string(status), At: at, Events: make([]EventRow, 0, len(docs))}
	for _, d := range docs {
		list.Events = append(list.Events, rowOf(d))
	}
	if next != nil {
		var err error
		if list.Next, err = encodeMark(*next); err != nil {
			return nil, err
		}
	}
	return list, nil
}

func (c *Console) event(r *http.Request) (any, error) {
	id := r.PathValue("id")
	doc, err := outboxOf(r).Store.Find(r.Context(), id)
	if errors.Is(err, mongo.ErrNoEvent) {
		return nil, errNotFound{err.Error()}
	}
	if err != nil {
		return nil, err
	}
	text, err := bson.MarshalExtJSONIndent(doc, false, false, "", "  ")
	if err != nil {
		text = []byte(fmt.Sprintf("(the document does not print as Extended JSON: %v)", err))
	}
	d := EventDetail{EventRow: rowOf(doc), Document: string(text), History: attemptsOf(doc)}
	if d.Skipped && d.Status == string(events.StatusFailed) && d.AggregateID != "" {
		if d.LaterPublished, err = outboxOf(r).Store.LaterPublished(r.Context(), d.AggregateType, d.AggregateID, d.CreatedAt, laterPublishedMax); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// failures is the failure groups its source keeps (Config.Lists), read
// on a schedule; without one, or before its first read, they are read
// and grouped for this view.
func (c *Console) failures(r *http.Request) (any, error) {
	if g, ok := keptGroups(outboxOf(r)); ok {
		return g, nil
	}
	g, err := outboxOf(r).Store.FailureGroups(r.Context(), c.now(r), ops.FailureGroupsLimit)
	g.At = time.Time{} // read for this view: the page says nothing of a schedule
	return g, err
}

// keptGroups is the failure groups o's Lists last read, unless it read
// them before this console last acted on o.
func keptGroups(o *served) (events.FailureGroups, bool) {
	if o.Lists == nil {
		return events.FailureGroups{}, false
	}
	g, ok := o.Lists.LatestGroups()
	return g, ok && o.fresh(g.At)
}

// fresh reports whether a list of o read at at is newer than this
// console's last action on o.
func (o *served) fresh(at time.Time) bool {
	acted := o.acted.Load()
	return acted == 0 || at.After(time.Unix(0, acted))
}

// keptFailedPage is the first page of the FAILED list, newest first,
// from the failure groups' read (keptGroups), and the mark of the next
// page; false where that read cannot give it.
func keptFailedPage(o *served, eq mongo.EventQuery) ([]bson.Raw, *mongo.PageMark, time.Time, bool) {
	if eq.Status != events.StatusFailed || eq.Type != "" || eq.AggregateID != "" || eq.ErrorText != "" ||
		eq.Group != nil || !eq.CreatedBefore.IsZero() || eq.After != nil {
		return nil, nil, time.Time{}, false
	}
	g, ok := keptGroups(o)
	switch {
	case !ok:
		return nil, nil, time.Time{}, false
	case len(g.Newest) <= eq.Limit && g.NewestAll:
		return g.Newest, nil, g.At, true
	case len(g.Newest) <= eq.Limit:
		return nil, nil, time.Time{}, false
	}
	docs := g.Newest[:eq.Limit]
	last := docs[len(docs)-1]
	at, _ := last.Lookup(events.FieldCreatedAt).TimeOK()
	var id any
	if err := last.Lookup(events.FieldID).Unmarshal(&id); err != nil {
		return nil, nil, time.Time{}, false
	}
	return docs, &mongo.PageMark{CreatedAt: at, ID: id}, g.At, true
}

// held is the held aggregates' holders its source keeps (Config.Lists),
// read on a schedule, or without one read for this view, and the paused
// types, read at each view: a pause shows at once.
func (c *Console) held(r *http.Request) (any, error) {
	now := c.now(r)
	h, ok := events.Holders{}, false
	if outboxOf(r).Lists != nil {
		h, ok = outboxOf(r).Lists.LatestHolders()
		ok = ok && outboxOf(r).fresh(h.At)
	}
	if !ok {
		list, capped, err := outboxOf(r).Store.Holders(r.Context(), now, outboxOf(r).FailedHolds, ops.HoldersLimit)
		if err != nil {
			return nil, err
		}
		h = events.Holders{List: list, Capped: capped}
	}
	holders, capped := h.List, h.Capped
	paused, err := outboxOf(r).Store.PausedTypes(r.Context())
	if err != nil {
		return nil, err
	}
	byType := make(map[string]events.Pause, len(paused))
	for _, p := range paused {
		byType[p.Type] = p
	}
	out := Held{At: h.At, Aggregates: make([]HeldAggregate, 0, len(holders)), Capped: capped, PausedTypes: paused}
	for _, h := range holders {
		row := rowOf(h.Doc)
		why := "FAILED: later events wait until it is requeued or skipped"
		p, isPaused := byType[row.Type]
		switch {
		case row.Status != string(events.StatusNew):
		case row.RetryAt.After(now):
			why = "backing off before a retry, until " + row.RetryAt.UTC().Format(time.RFC3339)
		case isPaused:
			why = fmt.Sprintf("its type %s is paused (by %s: %s): later events wait until it is resumed", p.Type, p.By, p.Reason)
		case !row.RetryAt.IsZero():
			// read before its retryAt passed (Config.Lists)
			why = "backed off until " + row.RetryAt.UTC().Format(time.RFC3339) + ": the relay retries it at its next claim"
		default:
			why = "NEW: its type was paused, and is no longer"
		}
		out.Aggregates = append(out.Aggregates, HeldAggregate{Key: row.AggregateType + "/" + row.AggregateID, Holder: row, Why: why})
	}
	return out, nil
}

// rowOf reads a stored event leniently: a field of the wrong type is
// shown empty rather than failing the page, for the console is where an
// operator looks at documents that are wrong.
func rowOf(doc bson.Raw) EventRow {
	str := func(key string) string { s, _ := doc.Lookup(key).StringValueOK(); return s }
	at := func(key string) time.Time { t, _ := doc.Lookup(key).TimeOK(); return t }
	attempts, _ := doc.Lookup(events.FieldAttempts).AsInt64OK()
	_, skipped := doc.Lookup(events.FieldSkippedAt).TimeOK()
	_, discarded := doc.Lookup(events.FieldDiscardedAt).TimeOK()
	return EventRow{
		ID: mongo.IDText(doc.Lookup(events.FieldID)), Type: str(events.FieldType),
		AggregateType: str(events.FieldAggregateType), AggregateID: str(events.FieldAggregateID),
		Status: str(events.FieldStatus), CreatedAt: at(events.FieldCreatedAt), Attempts: attempts,
		LastError: str(events.FieldLastError), RetryAt: at(events.FieldRetryAt), FailedAt: at(events.FieldFailedAt),
		Skipped: skipped, Discarded: discarded,
	}
}

// attemptsOf reads the attempt history leniently: entries that are not
// documents are left out.
func attemptsOf(doc bson.Raw) []events.AttemptError {
	arr, ok := doc.Lookup(events.FieldAttemptErrors).ArrayOK()
	if !ok {
		return nil
	}
	values, err := arr.Values()
	if err != nil {
		return nil
	}
	out := make([]events.AttemptError, 0, len(values))
	for _, v := range values {
		var a events.AttemptError
		if d, ok := v.DocumentOK(); ok && bson.Unmarshal(d, &a) == nil {
			out = append(out, a)
		}
	}
	return out
}

// titles are the pages' titles.
var titles = map[string]string{
	"overview": "Overview", "events": "Events", "event": "Event",
	"failures": "Failures by cause", "held": "Held aggregates",
	"audit": "Audit", "confirm": "Preview an action", "action": "An action",
}

// statusClass is the CSS class of a status.
func statusClass(s string) string { return "st-" + strings.ToLower(s) }
