package ferret

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// NewLogger returns a text logger for FerretDB at level, writing to w.
//
// FerretDB logs the full header and body of every response whose "ok" is 0 at
// Warn level, so each command error a client sees anyway (a duplicate key,
// the driver's unsupported endSessions on disconnect) becomes a dozen lines.
// Below Debug level, NewLogger drops those dumps and keeps every other
// message, including the Error-level dumps of responses that close the
// connection.
//
// At every level, NewLogger also demotes to Debug the Error-level record
// that FerretDB's PostgreSQL driver writes for an INSERT refused with a
// unique violation. That refusal is the client's answer (E11000 duplicate
// key), not a failure of the database: partition owners are taken by
// inserting a document whose _id may already exist, and the inbox records
// a message id by inserting it, so each replica's lost race or each
// redelivered message would otherwise log an error.
func NewLogger(w io.Writer, level slog.Level) *slog.Logger {
	var h slog.Handler = slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})
	if level > slog.LevelDebug {
		h = responseDumpFilter{h}
	}
	return slog.New(duplicateKeyDemoter{h})
}

// responseDumpFilter drops FerretDB's Warn-level dumps of failed responses.
type responseDumpFilter struct {
	slog.Handler
}

func (f responseDumpFilter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn && isResponseDump(r.Message) {
		return nil
	}
	return f.Handler.Handle(ctx, r)
}

func (f responseDumpFilter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return responseDumpFilter{f.Handler.WithAttrs(attrs)}
}

func (f responseDumpFilter) WithGroup(name string) slog.Handler {
	return responseDumpFilter{f.Handler.WithGroup(name)}
}

// isResponseDump reports whether msg is one of the two records FerretDB's
// connection logs per failed response ("Response header: ...",
// "Response message:\n...", or the same with "Proxy Response").
func isResponseDump(msg string) bool {
	for _, who := range []string{"Response", "Proxy Response"} {
		if strings.HasPrefix(msg, who+" header: ") || strings.HasPrefix(msg, who+" message:\n") {
			return true
		}
	}
	return false
}

// duplicateKeyDemoter logs the PostgreSQL driver's Error-level records of
// INSERTs refused with a unique violation at Debug level instead.
type duplicateKeyDemoter struct {
	slog.Handler
}

func (d duplicateKeyDemoter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelError && isDuplicateKeyInsert(r) {
		if !d.Handler.Enabled(ctx, slog.LevelDebug) {
			return nil
		}
		demoted := slog.NewRecord(r.Time, slog.LevelDebug, r.Message, r.PC)
		r.Attrs(func(a slog.Attr) bool { demoted.AddAttrs(a); return true })
		r = demoted
	}
	return d.Handler.Handle(ctx, r)
}

func (d duplicateKeyDemoter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return duplicateKeyDemoter{d.Handler.WithAttrs(attrs)}
}

func (d duplicateKeyDemoter) WithGroup(name string) slog.Handler {
	return duplicateKeyDemoter{d.Handler.WithGroup(name)}
}

// uniqueViolation is PostgreSQL's SQLSTATE of a duplicate key.
const uniqueViolation = "23505"

// isDuplicateKeyInsert reports whether r is the record the PostgreSQL
// driver's tracer writes for a failed query (attributes "sql" and "err")
// whose statement is an INSERT and whose error is a unique violation.
func isDuplicateKeyInsert(r slog.Record) bool {
	var insert, duplicate bool
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "sql":
			insert = strings.HasPrefix(strings.ToUpper(strings.TrimSpace(a.Value.String())), "INSERT ")
		case "err":
			duplicate = isUniqueViolation(a.Value)
		}
		return true
	})
	return insert && duplicate
}

func isUniqueViolation(v slog.Value) bool {
	if err, ok := v.Any().(error); ok {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return pgErr.Code == uniqueViolation
		}
	}
	return strings.Contains(v.String(), "(SQLSTATE "+uniqueViolation+")")
}
