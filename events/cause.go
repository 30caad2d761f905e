package events

import "regexp"

// The cause of a FAILED event, stored on it the first time the console
// groups it (mongo.Store.ClassifyFailed), so that a failure group is
// selected by equality on these fields, never by a pattern of lastError.
// A requeue unsets them with the rest of the failure.
const (
	// FieldFailureCause is lastError normalized (Cause).
	FieldFailureCause = "failureCause"
	// FieldFailureReason is the reason of the event's last failed
	// attempt (AttemptError.Reason), "" where none was recorded.
	FieldFailureReason = "failureReason"
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

// Cause is msg with what varies between events replaced, so that the
// events that failed the same way share it.
func Cause(msg string) string {
	for _, v := range variable {
		msg = v.re.ReplaceAllString(msg, v.with)
	}
	return msg
}
