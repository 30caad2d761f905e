package mongo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/outboxrelay/outbox/events"
)

// PausedSuffix names the collection of paused event types after the
// outbox collection: "<collection>_paused", one document per paused type
// (events.Pause, its _id the type).
const PausedSuffix = "_paused"

// PausedTypesMaxAge is how long a store's claims use the paused types they
// read before a claim reads them again: a pause or a resume written by
// another process acts on the claims that start after it, at most this
// much later. A pause or resume through the store itself acts on its next
// claim. Five seconds: read every second, the set was a fifth of a
// draining replica's finds (2.8 of 19.7 commands per 1,000 events in the
// bench's drain), for an operator who waits seconds either way.
const PausedTypesMaxAge = 5 * time.Second

// paused names the collection of paused types.
func (s *Store) paused() *mongo.Collection {
	return s.coll.Database().Collection(s.coll.Name() + PausedSuffix)
}

// Pause pauses p.Type: from the next claim that reads the paused types on,
// no replica claims its events (see findClaimable). It reports whether the
// type was paused now, false when it already was (its first record stays).
func (s *Store) Pause(ctx context.Context, p events.Pause) (bool, error) {
	if p.Type == "" {
		return false, errors.New("pause: an event type is required")
	}
	p.At = p.At.UTC().Truncate(time.Millisecond)
	p.By, p.Reason = truncateError(p.By), truncateError(p.Reason)
	_, err := s.paused().InsertOne(ctx, pausedDoc{Pause: p, Schema: SchemaVersion})
	s.pausedCache.forget()
	if mongo.IsDuplicateKeyError(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("pause type %q: %w", p.Type, err)
	}
	return true, nil
}

// Resume resumes typ, and reports whether it was paused.
func (s *Store) Resume(ctx context.Context, typ string) (bool, error) {
	if typ == "" {
		return false, errors.New("resume: an event type is required")
	}
	res, err := s.paused().DeleteOne(ctx, bson.D{{Key: "_id", Value: typ}})
	s.pausedCache.forget()
	if err != nil {
		return false, fmt.Errorf("resume type %q: %w", typ, err)
	}
	return res.DeletedCount > 0, nil
}

// PausedTypes returns the paused types, by type. It is one find on a
// collection of a document per paused type, with a server-side time limit
// from ctx's deadline like the periodic reads (see timedFind).
func (s *Store) PausedTypes(ctx context.Context) ([]events.Pause, error) {
	cmd := bson.D{{Key: "find", Value: s.paused().Name()}, {Key: "filter", Value: bson.D{}}, {Key: "sort", Value: bson.D{{Key: "_id", Value: 1}}}}
	if s.readConcern != "" {
		cmd = append(cmd, bson.E{Key: "readConcern", Value: bson.D{{Key: "level", Value: s.readConcern}}})
	}
	cur, err := s.coll.Database().RunCommandCursor(ctx, cmd)
	if err != nil {
		return nil, fmt.Errorf("read the paused types: %w", err)
	}
	var docs []pausedDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("read the paused types: %w", err)
	}
	out := make([]events.Pause, len(docs))
	for i, d := range docs {
		if err := checkSchema(s.paused().Name(), d.Type, d.Schema); err != nil {
			return nil, err
		}
		out[i] = d.Pause
	}
	return out, nil
}

// pausedDoc is a paused type as stored: events.Pause and the schema
// version.
type pausedDoc struct {
	events.Pause `bson:",inline"`
	Schema       int `bson:"schema,omitempty"`
}

// pausedSet is the set of paused types a claim leaves out: the one read
// last when it is younger than PausedTypesMaxAge, else read again.
func (s *Store) pausedSet(ctx context.Context) (map[string]bool, error) {
	if set, fresh := s.pausedCache.get(); fresh {
		return set, nil
	}
	read := time.Now()
	ps, err := s.PausedTypes(ctx)
	if err != nil {
		return nil, err
	}
	set := make(map[string]bool, len(ps))
	for _, p := range ps {
		set[p.Type] = true
	}
	s.pausedCache.put(set, read)
	return set, nil
}

// pausedCache keeps the paused types a store's claims read last, and when
// (on the monotonic clock, from before the read).
type pausedCache struct {
	mu     sync.Mutex
	set    map[string]bool // nil before the first read, and after forget
	readAt time.Time
	maxAge time.Duration
}

// get returns the set read last (never written to), and whether it is
// younger than maxAge.
func (c *pausedCache) get() (map[string]bool, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.set, c.set != nil && time.Since(c.readAt) < c.maxAge
}

func (c *pausedCache) put(set map[string]bool, readAt time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.set, c.readAt = set, readAt
}

// forget makes the next claim read the paused types, keeping the set for
// get until then.
func (c *pausedCache) forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readAt = time.Time{}
}

// typeOf is an event's type, "" when it has none that is a string.
func typeOf(doc bson.Raw) string {
	t, _ := doc.Lookup(events.FieldType).StringValueOK()
	return t
}
