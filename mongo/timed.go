package mongo

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// The periodic jobs (the sampler, recovery, retention, the held count)
// give each command a server-side time limit, maxTimeMS, so that a query
// the worker gave up on stops costing the database when its time is up
// instead of running to its end. Driver v2 computes maxTimeMS from the
// context's deadline, less the round trip it has measured, for every
// command but two: Collection.Find and Collection.Aggregate leave it out,
// always, because the cursor they return could outlive it (DRIVERS-2722).
// CountDocuments, FindOne, EstimatedDocumentCount, UpdateMany and
// DeleteMany send it. The periodic jobs' finds go through timedFind, which
// sends the find command with Database.RunCommandCursor: a command like any
// other, it gets maxTimeMS from the deadline. The server applies that
// limit to the find and its getMores together. Callers bound ctx; without a
// deadline no limit is sent.

// findCommand is a find that timedFind sends.
type findCommand struct {
	filter     bson.D
	sort       bson.D // none when nil
	projection bson.D // whole documents when nil
	// limit bounds the documents returned, in one reply; 0 for no limit.
	limit int
	// hint names the index; FerretDB ignores it.
	hint string
	// batch is how many documents a reply of a find without a limit
	// carries; the server's default (101, then 16 MiB) when 0.
	batch int
}

// timedFind runs find on the outbox collection with a server-side time
// limit from ctx's deadline (see above).
func (s *Store) timedFind(ctx context.Context, f findCommand) (*mongo.Cursor, error) {
	cmd := bson.D{{Key: "find", Value: s.coll.Name()}, {Key: "filter", Value: f.filter}}
	if f.sort != nil {
		cmd = append(cmd, bson.E{Key: "sort", Value: f.sort})
	}
	if f.projection != nil {
		cmd = append(cmd, bson.E{Key: "projection", Value: f.projection})
	}
	if f.hint != "" {
		cmd = append(cmd, bson.E{Key: "hint", Value: f.hint})
	}
	if f.limit > 0 {
		cmd = append(cmd, bson.E{Key: "limit", Value: int64(f.limit)}, bson.E{Key: "batchSize", Value: int64(oneBatch(f.limit))})
	} else if f.batch > 0 {
		cmd = append(cmd, bson.E{Key: "batchSize", Value: int64(f.batch)})
	}
	if s.readConcern != "" {
		// RunCommand sends no read concern of the client's: the find
		// must read what a failover cannot roll back, as every other.
		cmd = append(cmd, bson.E{Key: "readConcern", Value: bson.D{{Key: "level", Value: s.readConcern}}})
	}
	cur, err := s.coll.Database().RunCommandCursor(ctx, cmd)
	if err != nil {
		return nil, fmt.Errorf("find on %s: %w", s.coll.Name(), err)
	}
	return cur, nil
}

// timedDistinct returns the distinct values of key among the outbox
// events filter matches, with a server-side time limit from ctx's
// deadline (see above). It is an aggregate, not a distinct: FerretDB
// refuses a distinct that carries maxTimeMS.
func (s *Store) timedDistinct(ctx context.Context, key string, filter bson.D) ([]any, error) {
	cmd := bson.D{
		{Key: "aggregate", Value: s.coll.Name()},
		{Key: "pipeline", Value: bson.A{
			bson.D{{Key: "$match", Value: filter}},
			bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$" + key}}}},
		}},
		{Key: "cursor", Value: bson.D{}},
	}
	if s.readConcern != "" {
		cmd = append(cmd, bson.E{Key: "readConcern", Value: bson.D{{Key: "level", Value: s.readConcern}}})
	}
	cur, err := s.coll.Database().RunCommandCursor(ctx, cmd)
	if err != nil {
		return nil, fmt.Errorf("distinct %s on %s: %w", key, s.coll.Name(), err)
	}
	var groups []struct {
		Value any `bson:"_id"`
	}
	if err := cur.All(ctx, &groups); err != nil {
		return nil, fmt.Errorf("distinct %s on %s: %w", key, s.coll.Name(), err)
	}
	values := make([]any, 0, len(groups))
	for _, g := range groups {
		values = append(values, g.Value)
	}
	return values, nil
}

// closeCursor closes cur under a time limit of its own, since ctx may be
// what ran out: a cursor left open keeps the server's query running (on
// FerretDB its PostgreSQL query and connection, seen active eight minutes
// after the sampler gave up on it) until the server times the cursor out,
// minutes later, while the next run starts the same query again.
func closeCursor(ctx context.Context, cur *mongo.Cursor) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cursorCloseTimeout)
	defer cancel()
	_ = cur.Close(ctx)
}

// cursorCloseTimeout bounds the killCursors of closeCursor.
const cursorCloseTimeout = 5 * time.Second
