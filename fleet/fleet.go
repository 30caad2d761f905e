package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"

	"go.yaml.in/yaml/v3"
)

// NameMaxLength bounds an outbox's name: it is a label of every metric
// and a field of every log line, so it stays short.
const NameMaxLength = 32

// namePattern is what a name may be: lower-case letters, digits, "_" and
// "-", starting with a letter or a digit, so that it reads the same in a
// metric label, a log field, a URL query and a shell argument.
var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)

// Outbox is one outbox as the file lists it. Every field but the name is
// the text of a setting, parsed by the worker.
type Outbox struct {
	// Name names the outbox in logs, metrics, /status and /readyz.
	// Required: [a-z0-9_-], at most NameMaxLength, unique in the file.
	Name string `yaml:"name"`
	// Line is where the outbox starts in the file, for errors.
	Line int `yaml:"-"`

	// MongoURI, Database, Collection and Exchange say where the events
	// are and where they go. Database, Collection and Exchange are
	// required; MongoURI defaults to the worker's OUTBOX_MONGO_URI, so
	// that a cluster's credentials can stay in a secret rather than in
	// the file.
	MongoURI string `yaml:"mongo_uri"`
	Database string `yaml:"database"`
	// Databases, in place of Database, is a pattern of database names
	// (path.Match syntax: *, ?, [a-z]): the worker relays the collection
	// in every database of the cluster whose name matches, each as an
	// outbox of its own named DiscoveredName(Name, database), and looks
	// again every OUTBOX_FLEET_DISCOVERY_INTERVAL.
	Databases  string `yaml:"databases"`
	Collection string `yaml:"collection"`
	Exchange   string `yaml:"exchange"`

	// The settings an outbox may set apart from the worker's: each
	// defaults to the worker's own (its environment variable or flag).
	BatchSize           string `yaml:"batch_size"`
	ClaimSchedule       string `yaml:"claim_schedule"`
	ClaimIdleMax        string `yaml:"claim_idle_max"`
	RecoverySchedule    string `yaml:"recovery_schedule"`
	WakeOnInsert        string `yaml:"wake_on_insert"`
	MaxAttempts         string `yaml:"max_attempts"`
	Ordering            string `yaml:"ordering"`
	OrderingAfterFailed string `yaml:"ordering_after_failed"`
	MessageFormat       string `yaml:"message_format"`
	CloudEventsSource   string `yaml:"cloudevents_source"`
	CloudEventsPrefix   string `yaml:"cloudevents_prefix"`
	Retention           string `yaml:"retention"`
}

// Setting is one field of an outbox that the file sets: its name in the
// file and its text.
type Setting struct {
	Field, Value string
}

// Settings returns the fields of o that the file sets, other than the
// name, in the order Outbox declares them.
func (o Outbox) Settings() []Setting {
	all := []Setting{
		{"mongo_uri", o.MongoURI}, {"database", o.Database}, {"collection", o.Collection}, {"exchange", o.Exchange},
		{"batch_size", o.BatchSize}, {"claim_schedule", o.ClaimSchedule},
		{"claim_idle_max", o.ClaimIdleMax}, {"recovery_schedule", o.RecoverySchedule},
		{"wake_on_insert", o.WakeOnInsert}, {"max_attempts", o.MaxAttempts},
		{"ordering", o.Ordering}, {"ordering_after_failed", o.OrderingAfterFailed},
		{"message_format", o.MessageFormat}, {"cloudevents_source", o.CloudEventsSource},
		{"cloudevents_prefix", o.CloudEventsPrefix}, {"retention", o.Retention},
	}
	var set []Setting
	for _, s := range all {
		if s.Value != "" {
			set = append(set, s)
		}
	}
	return set
}

// Fields lists every field of an outbox other than its name, for the
// worker to check that it reads each one.
func Fields() []string {
	full := Outbox{
		MongoURI: "x", Database: "x", Collection: "x", Exchange: "x", BatchSize: "x", ClaimSchedule: "x",
		ClaimIdleMax: "x", RecoverySchedule: "x", WakeOnInsert: "x", MaxAttempts: "x", Ordering: "x", OrderingAfterFailed: "x",
		MessageFormat: "x", CloudEventsSource: "x", CloudEventsPrefix: "x", Retention: "x",
	}
	var names []string
	for _, s := range full.Settings() {
		names = append(names, s.Field)
	}
	return names
}

// file is the document: a list of outboxes.
type file struct {
	Outboxes []Outbox `yaml:"outboxes"`
}

// Error is a fault of the file: Outbox names the outbox ("" for the file
// as a whole), Field the field ("" for the outbox as a whole).
type Error struct {
	Line          int
	Outbox, Field string
	Why           string
}

func (e *Error) Error() string {
	var b bytes.Buffer
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Outbox != "" {
		fmt.Fprintf(&b, "outbox %q: ", e.Outbox)
	}
	if e.Field != "" {
		fmt.Fprintf(&b, "%s: ", e.Field)
	}
	b.WriteString(e.Why)
	return b.String()
}

// Load reads and parses the file at path.
func Load(path string) ([]Outbox, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	outboxes, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return outboxes, nil
}

// Parse parses a file's text. A field the file does not know is an error
// (a misspelt setting would otherwise leave its default in place without
// a word), as are a missing or malformed name, a name used twice, a
// missing database, collection or exchange, and a file with no outbox.
func Parse(data []byte) ([]Outbox, error) {
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Error{Why: "no outbox listed (want outboxes: followed by a list)"}
		}
		return nil, &Error{Why: err.Error()}
	}
	if err := dec.Decode(new(file)); !errors.Is(err, io.EOF) {
		return nil, &Error{Why: "more than one YAML document; want one"}
	}
	if len(f.Outboxes) == 0 {
		return nil, &Error{Why: "no outbox listed (want outboxes: followed by a list)"}
	}
	lines := entryLines(data)
	seen := map[string]int{}
	for i := range f.Outboxes {
		o := &f.Outboxes[i]
		if i < len(lines) {
			o.Line = lines[i]
		}
		if err := CheckName(o.Name); err != nil {
			return nil, &Error{Line: o.Line, Outbox: o.Name, Field: "name", Why: err.Error()}
		}
		if first, ok := seen[o.Name]; ok {
			return nil, &Error{Line: o.Line, Outbox: o.Name, Field: "name", Why: fmt.Sprintf("already the name of the outbox at line %d; want a name of its own", first)}
		}
		seen[o.Name] = o.Line
		if err := checkWhere(*o); err != nil {
			return nil, err
		}
	}
	return f.Outboxes, nil
}

// checkWhere checks that o names its database or a pattern of them (one
// of the two), its collection and its exchange.
func checkWhere(o Outbox) error {
	switch {
	case o.Database != "" && o.Databases != "":
		return &Error{Line: o.Line, Outbox: o.Name, Field: "databases", Why: "set beside database; want one of the two"}
	case o.Databases != "":
		if err := CheckPattern(o.Databases); err != nil {
			return &Error{Line: o.Line, Outbox: o.Name, Field: "databases", Why: err.Error()}
		}
	case o.Database == "":
		return &Error{Line: o.Line, Outbox: o.Name, Field: "database", Why: "required (or databases, a pattern of them)"}
	}
	for _, req := range []Setting{{"collection", o.Collection}, {"exchange", o.Exchange}} {
		if req.Value == "" {
			return &Error{Line: o.Line, Outbox: o.Name, Field: req.Field, Why: "required"}
		}
	}
	return nil
}

// CheckName says what is wrong with an outbox's name, or nil.
func CheckName(name string) error {
	switch {
	case name == "":
		return errors.New("required")
	case len(name) > NameMaxLength:
		return fmt.Errorf("%q is longer than %d characters", name, NameMaxLength)
	case !namePattern.MatchString(name):
		return fmt.Errorf("%q: want lower-case letters, digits, _ and -, starting with a letter or a digit", name)
	}
	return nil
}

// entryLines returns the line of each entry of the outboxes list, read
// from the document's nodes (the decoded structs do not keep them).
func entryLines(data []byte) []int {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 {
		return nil
	}
	root := doc.Content[0]
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value != "outboxes" {
			continue
		}
		var lines []int
		for _, entry := range root.Content[i+1].Content {
			lines = append(lines, entry.Line)
		}
		return lines
	}
	return nil
}
