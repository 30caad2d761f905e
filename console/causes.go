package console

import (
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/mongo"
)

// The parts of an error message that differ between events that failed
// the same way, most specific first: quoted values, UUIDs, ObjectIDs and
// other long hex, and numbers.
var variable = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`"(?:[^"\\]|\\.)*"`), `"…"`},
	{regexp.MustCompile(`'(?:[^'\\]|\\.)*'`), `'…'`},
	{regexp.MustCompile(`(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`), "<uuid>"},
	{regexp.MustCompile(`(?i)\b[0-9a-f]{16,}\b`), "<hex>"},
	{regexp.MustCompile(`\b\d+(?:\.\d+)?\b`), "<n>"},
}

// normalize is msg with what varies between events replaced, so that the
// events that failed the same way share it.
func normalize(msg string) string {
	for _, v := range variable {
		msg = v.re.ReplaceAllString(msg, v.with)
	}
	return msg
}

// placeholders split a normalized cause into its literal parts.
var placeholders = regexp.MustCompile(`"…"|'…'|<uuid>|<hex>|<n>`)

// causePattern is a regular expression that every lastError normalizing
// to cause matches: its literal parts in order, anything between them.
func causePattern(cause string) string {
	parts := placeholders.Split(cause, -1)
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return "^" + strings.Join(parts, "(?s:.*?)") + "$"
}

// groupFailures groups FAILED events by the reason of their last attempt
// and their normalized lastError, largest group first. Skipped events
// are left out: an operator has dealt with them.
func groupFailures(docs []bson.Raw) []FailureGroup {
	type key struct{ reason, cause string }
	groups := map[key]*FailureGroup{}
	for _, d := range docs {
		if _, skipped := d.Lookup(events.FieldSkippedAt).TimeOK(); skipped {
			continue
		}
		row := rowOf(d)
		reason := ""
		if h := attemptsOf(d); len(h) > 0 {
			reason = h[len(h)-1].Reason
		}
		k := key{reason, normalize(row.LastError)}
		g := groups[k]
		if g == nil {
			g = &FailureGroup{Reason: reason, Cause: k.cause, Example: row.ID, Latest: row.CreatedAt}
			groups[k] = g
		}
		g.Count++
		if row.CreatedAt.After(g.Latest) {
			g.Latest, g.Example = row.CreatedAt, row.ID
		}
	}
	out := make([]FailureGroup, 0, len(groups))
	for _, g := range groups {
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b FailureGroup) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Reason, b.Reason), cmp.Compare(a.Cause, b.Cause))
	})
	return out
}

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
