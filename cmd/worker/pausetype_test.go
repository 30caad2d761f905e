package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/mongo"
)

// TestPauseCommands: `worker pause TYPE` and `worker resume TYPE` pause
// and resume a type with who and why, `worker stats` lists it while it is
// paused, and each change is an audit record; one that changed nothing
// records nothing, and a pause without a type or a reason is refused.
func TestPauseCommands(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	db := testenv.Database(t)
	doc := draftDoc(t, events.Draft{ID: "e1", Type: "order.paid", Payload: bson.D{{Key: "n", Value: 1}}}, time.Now().UTC(),
		bson.E{Key: events.FieldStatus, Value: events.StatusNew})
	coll, env := toolsOutbox(ctx, t, testenv.MongoURI(t), db, []any{doc})

	runTool(ctx, t, env, 2, "pause", "--reason", "no type")
	runTool(ctx, t, env, 2, "pause", "order.paid", "--by", "ana")
	runTool(ctx, t, env, 2, "pause", "order.paid", "--type", "order.created", "--reason", "two types")
	if out := runTool(ctx, t, env, 0, "pause", "order.paid", "--by", "ana", "--reason", "billing is down"); !strings.HasPrefix(out, "paused type order.paid") {
		t.Errorf("pause printed %q", out)
	}
	if out := runTool(ctx, t, env, 0, "pause", "--type", "order.paid", "--by", "bo", "--reason", "again"); !strings.Contains(out, "already paused") {
		t.Errorf("a second pause printed %q, want it to say the type was already paused", out)
	}
	if out := runTool(ctx, t, env, 0, "stats"); !strings.Contains(out, "paused type order.paid") || !strings.Contains(out, "billing is down") {
		t.Errorf("stats does not list the paused type:\n%s", out)
	}
	var st struct {
		Paused []events.Pause `json:"pausedTypes"`
	}
	if err := json.Unmarshal([]byte(runTool(ctx, t, env, 0, "stats", "--json")), &st); err != nil || len(st.Paused) != 1 || st.Paused[0].By != "ana" {
		t.Errorf("stats --json pausedTypes = %+v, %v; want order.paid by ana", st.Paused, err)
	}
	if out := runTool(ctx, t, env, 0, "resume", "order.paid", "--by", "bo", "--reason", "billing is back"); !strings.HasPrefix(out, "resumed type order.paid") {
		t.Errorf("resume printed %q", out)
	}
	if out := runTool(ctx, t, env, 0, "resume", "order.paid", "--reason", "twice"); !strings.Contains(out, "was not paused") {
		t.Errorf("a second resume printed %q", out)
	}
	if out := runTool(ctx, t, env, 0, "stats"); !strings.Contains(out, "paused types") || strings.Contains(out, "paused type order.paid") {
		t.Errorf("stats after the resume:\n%s", out)
	}

	store := mongo.New(db.Client(), mongo.Config{Database: db.Name(), Collection: coll.Name()})
	got, err := store.Actions(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	type rec struct{ Name, By, Reason, Target, Source string }
	var seen []rec
	for _, a := range got {
		seen = append(seen, rec{a.Name, a.By, a.Reason, a.Target, a.Source})
		if a.Count != 1 {
			t.Errorf("%s recorded with count %d, want 1 (one type)", a.Name, a.Count)
		}
	}
	want := []rec{
		{"resume", "bo", "billing is back", "type: order.paid", "cli"},
		{"pause", "ana", "billing is down", "type: order.paid", "cli"},
	}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Errorf("audit records (-want +got):\n%s", diff)
	}
}
