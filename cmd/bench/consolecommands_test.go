package main

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestPushdown: what FerretDB v1 hands to PostgreSQL is the top-level
// equalities and $ne with a scalar; null, $in, ranges, regular
// expressions and $and/$or stay in Go.
func TestPushdown(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		name   string
		filter bson.D
		want   string
	}{
		{"status", bson.D{{Key: "status", Value: "FAILED"}}, `{"status":"FAILED"}`},
		{"status and null", bson.D{{Key: "status", Value: "FAILED"}, {Key: "skippedAt", Value: nil}}, `{"status":"FAILED"}`},
		{"$eq and $ne", bson.D{{Key: "a", Value: bson.D{{Key: "$eq", Value: int32(1)}}}, {Key: "b", Value: bson.D{{Key: "$ne", Value: "x"}}}},
			`{"a":{"$eq":1},"b":{"$ne":"x"}}`},
		{"range and $in", bson.D{{Key: "status", Value: "NEW"}, {Key: "retryAt", Value: bson.D{{Key: "$gt", Value: at}}},
			{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{"a"}}}}}, `{"status":"NEW"}`},
		{"$and and regex", bson.D{{Key: "$and", Value: bson.A{bson.D{{Key: "status", Value: "FAILED"}}}},
			{Key: "lastError", Value: bson.Regex{Pattern: "x"}}}, `{}`},
		{"a date", bson.D{{Key: "createdAt", Value: at}}, `{"createdAt":{"$date":"2026-01-02T03:04:05Z"}}`},
	} {
		raw, err := bson.Marshal(c.filter)
		if err != nil {
			t.Fatal(err)
		}
		got, err := bson.MarshalExtJSON(pushdown(raw), false, false)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != c.want {
			t.Errorf("%s: pushdown = %s, want %s", c.name, got, c.want)
		}
	}
}
