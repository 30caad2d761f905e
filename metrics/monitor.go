package metrics

import (
	"context"
	"maps"
	"slices"

	"go.mongodb.org/mongo-driver/v2/event"
)

// countedCommands are the command names counted under their own label;
// anything else counts as "other", so a label never takes an open set of
// values.
var countedCommands = map[string]bool{
	"find": true, "getMore": true, "update": true, "delete": true, "insert": true,
	"aggregate": true, "count": true, "commitTransaction": true, "abortTransaction": true,
	"createIndexes": true, "ping": true, "hello": true, "endSessions": true, "killCursors": true,
}

// otherCommand is the label of every command not in countedCommands.
const otherCommand = "other"

// DBCommands are the values of DBCommands' command label, sorted, "other"
// last: each is exported from the start at 0.
func DBCommands() []string {
	return append(slices.Sorted(maps.Keys(countedCommands)), otherCommand)
}

// CommandMonitor counts every command the driver starts: the database cost
// of relaying, which carries over from any test server to MongoDB.
func (m *Metrics) CommandMonitor() *event.CommandMonitor {
	return &event.CommandMonitor{
		Started: func(_ context.Context, e *event.CommandStartedEvent) {
			name := e.CommandName
			if !countedCommands[name] {
				name = otherCommand
			}
			m.DBCommands.WithLabelValues(name).Inc()
		},
	}
}
