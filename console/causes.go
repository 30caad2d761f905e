package console

import (
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/mongo"
)

// pageMark is a mongo.PageMark as the events page's cursor carries it.
type pageMark struct {
	CreatedAt time.Time `bson:"c"`
	ID        any       `bson:"i"`
}

// encodeMark is the cursor of the page after mark: URL-safe, and opaque
// to the operator, who follows the page's link.
func encodeMark(mark mongo.PageMark) (string, error) {
	b, err := bson.Marshal(pageMark(mark))
	if err != nil {
		return "", fmt.Errorf("encode the next page's cursor: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// decodeMark reads a cursor encodeMark wrote.
func decodeMark(s string) (*mongo.PageMark, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || bson.Raw(b).Validate() != nil {
		return nil, errors.New("not a cursor of this console; start from the first page")
	}
	var m pageMark
	if err := bson.Unmarshal(b, &m); err != nil || m.ID == nil {
		return nil, errors.New("not a cursor of this console; start from the first page")
	}
	return &mongo.PageMark{CreatedAt: m.CreatedAt, ID: m.ID}, nil
}
