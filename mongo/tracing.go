package mongo

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	driver "go.mongodb.org/mongo-driver/v2/mongo"
	xdriver "go.mongodb.org/mongo-driver/v2/x/mongo/driver"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation scope of the command spans.
const TracerName = "github.com/outboxrelay/outbox/mongo"

// CommandTracer returns a command monitor that traces each database
// command the client sends as a span of kind CLIENT, a child of the span
// of the context the command was sent with, named for the command and its
// collection ("update events") and carrying the OpenTelemetry database
// conventions: db.system.name, db.operation.name, db.collection.name,
// db.namespace, server.address and server.port, and on a failure the
// server's error code as db.response.status_code. It never records the
// command or its reply: both hold event payloads. (It stands in for
// contrib's otelmongo, which the module proxy here does not serve for
// driver v2.)
func CommandTracer(tp trace.TracerProvider) *event.CommandMonitor {
	t := &commandTracer{tracer: tp.Tracer(TracerName)}
	return &event.CommandMonitor{Started: t.started, Succeeded: t.succeeded, Failed: t.failed}
}

type commandTracer struct {
	tracer trace.Tracer
	spans  sync.Map // commandKey -> trace.Span
}

// commandKey is a command in flight: request ids are unique per client,
// the connection makes sure.
type commandKey struct {
	conn string
	id   int64
}

func (c *commandTracer) started(ctx context.Context, e *event.CommandStartedEvent) {
	attrs := []attribute.KeyValue{
		semconv.DBSystemNameMongoDB,
		semconv.DBOperationName(e.CommandName),
		semconv.DBNamespace(e.DatabaseName),
	}
	name := e.CommandName
	if coll := collectionOf(e.CommandName, e.Command); coll != "" {
		attrs = append(attrs, semconv.DBCollectionName(coll))
		name += " " + coll
	}
	if host, port, ok := serverOf(e.ConnectionID); ok {
		attrs = append(attrs, semconv.ServerAddress(host), semconv.ServerPort(port))
	}
	_, span := c.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	c.spans.Store(commandKey{e.ConnectionID, e.RequestID}, span)
}

func (c *commandTracer) succeeded(_ context.Context, e *event.CommandSucceededEvent) {
	if span, ok := c.spans.LoadAndDelete(commandKey{e.ConnectionID, e.RequestID}); ok {
		span.(trace.Span).End()
	}
}

func (c *commandTracer) failed(_ context.Context, e *event.CommandFailedEvent) {
	v, ok := c.spans.LoadAndDelete(commandKey{e.ConnectionID, e.RequestID})
	if !ok {
		return
	}
	span := v.(trace.Span)
	// The code and its name only: a server's message may quote a document
	// (a duplicate key's value).
	errType := "error"
	var se xdriver.Error
	if errors.As(e.Failure, &se) && se.Code != 0 {
		span.SetAttributes(semconv.DBResponseStatusCode(strconv.Itoa(int(se.Code))))
		errType = strconv.Itoa(int(se.Code))
		if se.Name != "" {
			errType = se.Name
		}
	}
	switch {
	case driver.IsTimeout(e.Failure):
		errType = "timeout"
	case driver.IsNetworkError(e.Failure):
		errType = "network"
	}
	span.SetAttributes(semconv.ErrorTypeKey.String(errType))
	span.SetStatus(codes.Error, e.CommandName+" failed")
	span.End()
}

// collectionCommands are the commands whose first element's value is the
// collection they work on.
var collectionCommands = map[string]bool{
	"find": true, "insert": true, "update": true, "delete": true, "aggregate": true,
	"count": true, "distinct": true, "findAndModify": true, "createIndexes": true,
	"dropIndexes": true, "listIndexes": true, "create": true, "drop": true, "collMod": true,
}

// collectionOf reads the collection a command works on from its first
// element (getMore: its "collection" field), and nothing else of it.
func collectionOf(command string, doc bson.Raw) string {
	var v bson.RawValue
	switch {
	case command == "getMore":
		v = doc.Lookup("collection")
	case collectionCommands[command]:
		first, err := doc.IndexErr(0)
		if err != nil {
			return ""
		}
		v = first.Value()
	default:
		return ""
	}
	s, _ := v.StringValueOK()
	return s
}

// serverOf reads the server's host and port from a connection id
// ("host:port[-12]").
func serverOf(connectionID string) (string, int, bool) {
	addr, _, _ := strings.Cut(connectionID, "[")
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, false
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, false
	}
	return host, port, true
}

// Monitors returns a monitor that passes each event to each of monitors
// in turn (nil ones, and nil handlers, are skipped): the driver takes one.
func Monitors(monitors ...*event.CommandMonitor) *event.CommandMonitor {
	var started []func(context.Context, *event.CommandStartedEvent)
	var succeeded []func(context.Context, *event.CommandSucceededEvent)
	var failed []func(context.Context, *event.CommandFailedEvent)
	for _, m := range monitors {
		if m == nil {
			continue
		}
		if m.Started != nil {
			started = append(started, m.Started)
		}
		if m.Succeeded != nil {
			succeeded = append(succeeded, m.Succeeded)
		}
		if m.Failed != nil {
			failed = append(failed, m.Failed)
		}
	}
	out := &event.CommandMonitor{}
	if len(started) > 0 {
		out.Started = func(ctx context.Context, e *event.CommandStartedEvent) {
			for _, f := range started {
				f(ctx, e)
			}
		}
	}
	if len(succeeded) > 0 {
		out.Succeeded = func(ctx context.Context, e *event.CommandSucceededEvent) {
			for _, f := range succeeded {
				f(ctx, e)
			}
		}
	}
	if len(failed) > 0 {
		out.Failed = func(ctx context.Context, e *event.CommandFailedEvent) {
			for _, f := range failed {
				f(ctx, e)
			}
		}
	}
	return out
}
