package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
)

// PageCommand is one database command a console page sent in its last
// timed run: its name, the collection, how long it took, and on FerretDB
// how many documents FerretDB fetched and decoded for it, which is every
// document that matches the part of its filter FerretDB hands to
// PostgreSQL (pushdown): the equalities on top-level fields. FerretDB
// filters, sorts and limits the rest in Go.
type PageCommand struct {
	Name       string  `json:"name"`
	Collection string  `json:"collection"`
	Ms         float64 `json:"ms"`
	// Pushdown is the part of the filter FerretDB hands to PostgreSQL,
	// as Extended JSON; "{}" when it hands none.
	Pushdown string `json:"pushdown,omitempty"`
	// Decoded is how many documents match Pushdown: the documents
	// FerretDB decoded for the command; -1 where not counted.
	Decoded int64 `json:"decoded"`
}

// commandLog records the commands a client sends, with their times.
type commandLog struct {
	mu      sync.Mutex
	started map[int64]PageCommand
	filters map[int64]bson.Raw
	done    []PageCommand
	raw     []bson.Raw // the done commands' filters, in order
}

func newCommandLog() *commandLog {
	return &commandLog{started: map[int64]PageCommand{}, filters: map[int64]bson.Raw{}}
}

// monitor is the command monitor that feeds l.
func (l *commandLog) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{
		Started: func(_ context.Context, e *event.CommandStartedEvent) {
			coll, _ := e.Command.Lookup(e.CommandName).StringValueOK()
			l.mu.Lock()
			defer l.mu.Unlock()
			l.started[e.RequestID] = PageCommand{Name: e.CommandName, Collection: coll}
			l.filters[e.RequestID] = append(bson.Raw(nil), commandFilter(e.CommandName, e.Command)...)
		},
		Succeeded: func(_ context.Context, e *event.CommandSucceededEvent) { l.finish(e.RequestID, e.Duration) },
		Failed:    func(_ context.Context, e *event.CommandFailedEvent) { l.finish(e.RequestID, e.Duration) },
	}
}

func (l *commandLog) finish(id int64, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.started[id]
	if !ok {
		return
	}
	c.Ms = round(float64(d)/float64(time.Millisecond), 1)
	l.done = append(l.done, c)
	l.raw = append(l.raw, l.filters[id])
	delete(l.started, id)
	delete(l.filters, id)
}

// take returns the commands done since the last take, with their
// filters, and forgets them.
func (l *commandLog) take() ([]PageCommand, []bson.Raw) {
	l.mu.Lock()
	defer l.mu.Unlock()
	done, raw := l.done, l.raw
	l.done, l.raw = nil, nil
	return done, raw
}

// commandFilter is the filter of a find, count or aggregate (its first
// $match); nil for other commands.
func commandFilter(name string, cmd bson.Raw) bson.Raw {
	switch name {
	case "find":
		f, _ := cmd.Lookup("filter").DocumentOK()
		return f
	case "count":
		f, _ := cmd.Lookup("query").DocumentOK()
		return f
	case "aggregate":
		stages, ok := cmd.Lookup("pipeline").ArrayOK()
		if !ok {
			return nil
		}
		first, err := stages.IndexErr(0)
		if err != nil {
			return nil
		}
		stage, _ := first.DocumentOK()
		f, _ := stage.Lookup("$match").DocumentOK()
		return f
	}
	return nil
}

// pushdown is the part of filter that FerretDB v1 hands to PostgreSQL:
// its top-level fields compared by equality ({f: v} or {f: {$eq: v}})
// or $ne with a string, number, boolean, date or ObjectID. Everything
// else (null, $in, ranges, $or, regular expressions) it checks in Go on
// every document the pushed part returns.
func pushdown(filter bson.Raw) bson.D {
	out := bson.D{}
	elems, _ := filter.Elements()
	for _, e := range elems {
		key := e.Key()
		if strings.HasPrefix(key, "$") {
			continue
		}
		v := e.Value()
		if pushable(v) {
			out = append(out, bson.E{Key: key, Value: v})
			continue
		}
		ops, ok := v.DocumentOK()
		if !ok {
			continue
		}
		inner, _ := ops.Elements()
		for _, op := range inner {
			if (op.Key() == "$eq" || op.Key() == "$ne") && pushable(op.Value()) {
				out = append(out, bson.E{Key: key, Value: bson.D{{Key: op.Key(), Value: op.Value()}}})
			}
		}
	}
	return out
}

// pushable reports whether FerretDB hands an equality with v to
// PostgreSQL.
func pushable(v bson.RawValue) bool {
	switch v.Type {
	case bson.TypeString, bson.TypeObjectID, bson.TypeDateTime, bson.TypeBoolean,
		bson.TypeInt32, bson.TypeInt64, bson.TypeDouble:
		return true
	}
	return false
}

// countDecoded fills in what FerretDB decoded for each command on db:
// the documents its pushdown matches, counted once per distinct
// pushdown of a collection, remembered in counted (a count decodes them
// all too, so this runs after the timed runs).
func countDecoded(ctx context.Context, db *driver.Database, cmds []PageCommand, filters []bson.Raw, counted map[string]int64) {
	for i := range cmds {
		cmds[i].Decoded = -1
		if filters[i] == nil || cmds[i].Collection == "" {
			continue
		}
		push := pushdown(filters[i])
		text, err := bson.MarshalExtJSON(push, false, false)
		if err != nil {
			continue
		}
		cmds[i].Pushdown = string(text)
		key := cmds[i].Collection + " " + cmds[i].Pushdown
		n, ok := counted[key]
		if !ok {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			n, err = db.Collection(cmds[i].Collection).CountDocuments(cctx, push)
			cancel()
			if err != nil {
				n = -1
			}
			counted[key] = n
		}
		cmds[i].Decoded = n
	}
}

// describeCommands is one line of a page's commands: each command's
// name, collection, time and documents decoded, slowest first.
func describeCommands(cmds []PageCommand) string {
	sorted := append([]PageCommand(nil), cmds...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Ms > sorted[j].Ms })
	parts := make([]string, 0, len(sorted))
	for _, c := range sorted {
		p := fmt.Sprintf("%s %s %.0f ms", c.Name, c.Collection, c.Ms)
		if c.Decoded >= 0 {
			p += fmt.Sprintf(" (%s decoded: %s)", thousands(int(c.Decoded)), c.Pushdown)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}
