package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/outboxrelay/outbox/events"
	"github.com/outboxrelay/outbox/internal/testenv"
	"github.com/outboxrelay/outbox/internal/workerproc"
	"github.com/outboxrelay/outbox/mongo"
)

// TestOwnersNotWritable runs real workers whose database user may read
// <collection>_owners but not write it, as after a least-privilege role
// left the owners collection out: the server answers every insert, update
// and delete on it with Unauthorized (code 13), as MongoDB does. A proxy
// in front of FerretDB, which has no roles, answers for it.
//
// Nothing can be relayed, and nothing may be silent about it: the
// ownership errors and the unowned claims are counted, no partition is
// owned, /readyz fails with the reason once a term has passed, /status
// says why, and the backlog gauges are exported although no replica leads.
func TestOwnersNotWritable(t *testing.T) {
	t.Parallel()
	s := localStack(t)
	u, err := url.Parse(s.mongoURI)
	if err != nil || strings.Contains(u.Host, ",") || u.Host == "" {
		t.Skipf("the proxy stands in front of one server; OUTBOX_TEST_MONGO_URI names %q", u.Host)
	}
	const n = 40
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	db, coll, exchange, r := s.relayed(t)
	ids := insertBacklog(ctx, t, coll, n, "e2e.stall")

	owners := mongo.CollectionDefault + mongo.OwnersSuffix
	proxied := *u
	proxied.Host = denyWrites(t, u.Host, owners)
	var procs []*workerproc.Proc
	for i := range 2 {
		id := fmt.Sprintf("%s-w%d", db.Name(), i)
		env := s.workerEnv(db.Name(), exchange, id)
		env["OUTBOX_MONGO_URI"] = proxied.String()
		env["OUTBOX_STALE_AFTER"] = "10s" // terms of 5s
		env["OUTBOX_LOG_LEVEL"] = "info"  // "worker running" gives the HTTP address
		procs = append(procs, startWorker(t, id, env))
	}

	for _, p := range procs {
		testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
			code, body := workerGet(ctx, t, p, "/readyz")
			var ready struct {
				Ready  bool   `json:"ready"`
				Reason string `json:"reason"`
			}
			_ = json.Unmarshal(body, &ready)
			return code == http.StatusServiceUnavailable && strings.HasPrefix(ready.Reason, "ownership: ") &&
					strings.Contains(ready.Reason, "not authorized"),
				fmt.Sprintf("%s: /readyz %d %s, want 503 with an ownership reason naming the refused write", p.Name(), code, body)
		})

		var status struct {
			Ownership *struct {
				Partitions int    `json:"partitions"`
				LastError  string `json:"lastError"`
				NotReady   string `json:"notReady"`
			} `json:"ownership"`
		}
		getStatus(ctx, t, p, &status)
		switch o := status.Ownership; {
		case o == nil:
			t.Errorf("%s: /status has no ownership", p.Name())
		case o.Partitions != 0 || !strings.Contains(o.LastError, "Unauthorized") || !strings.Contains(o.NotReady, "owners collection"):
			t.Errorf("%s: /status ownership = %+v, want 0 partitions, the refused write and why it is not ready", p.Name(), *o)
		}

		// The gauges come once no leader has been seen for a term, at
		// the next sample (every 15s).
		testenv.Eventually(t, timeLeft(ctx), func() (bool, string) {
			m := scrape(ctx, t, p)
			return m[`outbox_events{outbox="default",status="NEW"}`] == n && m[`outbox_oldest_new_event_age_seconds{outbox="default"}`] > 0,
				fmt.Sprintf("%s: backlog gauges NEW=%v oldest=%v, want %d and an age", p.Name(), m[`outbox_events{outbox="default",status="NEW"}`], m[`outbox_oldest_new_event_age_seconds{outbox="default"}`], n)
		})
		m := scrape(ctx, t, p)
		for _, c := range []struct {
			series string
			ok     func(float64) bool
			want   string
		}{
			{`outbox_job_errors_total{job="ownership",outbox="default"}`, func(v float64) bool { return v > 0 }, "rising"},
			{`outbox_claim_runs_total{outbox="default",result="unowned"}`, func(v float64) bool { return v > 0 }, "rising"},
			{`outbox_claim_runs_total{outbox="default",result="claimed"}`, func(v float64) bool { return v == 0 }, "0"},
			{`outbox_partitions_owned{outbox="default"}`, func(v float64) bool { return v == 0 }, "0"},
			{`outbox_events_published_total{outbox="default"}`, func(v float64) bool { return v == 0 }, "0"},
		} {
			v, ok := m[c.series]
			if !ok || !c.ok(v) {
				t.Errorf("%s: %s = %v (exported: %t), want %s", p.Name(), c.series, v, ok, c.want)
			}
		}
	}

	// Nothing was relayed: every event is still NEW, none arrived.
	waitCount(ctx, t, coll, bson.D{{Key: events.FieldStatus, Value: events.StatusNew}}, n)
	if got := r.distinct(); got != 0 {
		t.Errorf("%d events of %d arrived, want none: no replica owns a partition", got, len(ids))
	}
}

// workerGet sends GET path to the worker's HTTP address and returns the
// status code and body.
func workerGet(ctx context.Context, t *testing.T, p *workerproc.Proc, path string) (int, []byte) {
	t.Helper()
	addr := httpAddr(t, p)
	if addr == "" {
		return 0, []byte(`no "worker running" line in the log yet`)
	}
	code, body, err := httpGet(ctx, "http://"+addr+path)
	if err != nil && code == 0 {
		return 0, []byte(err.Error())
	}
	return code, body
}

var sampleLine = regexp.MustCompile(`^(outbox_[a-z_]+(?:\{[^}]*\})?) (\S+)$`)

// scrape reads the worker's outbox_ series from /metrics, by their text
// (name and labels).
func scrape(ctx context.Context, t *testing.T, p *workerproc.Proc) map[string]float64 {
	t.Helper()
	code, body := workerGet(ctx, t, p, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("%s: GET /metrics = %d %s", p.Name(), code, body)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		if m := sampleLine.FindStringSubmatch(sc.Text()); m != nil {
			v, err := strconv.ParseFloat(m[2], 64)
			if err == nil {
				out[m[1]] = v
			}
		}
	}
	return out
}

// denyWrites starts a proxy to the MongoDB server at target that answers
// every insert, update, delete and findAndModify on the collection coll
// with Unauthorized, as a server whose user lacks the privileges does, and
// forwards everything else. It returns the proxy's address; it is closed
// in t.Cleanup.
func denyWrites(t *testing.T, target, coll string) string {
	t.Helper()
	return testenv.Serve(t, func(client net.Conn) {
		server, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(t.Context(), "tcp", target)
		if err != nil {
			_ = client.Close()
			return
		}
		var wg sync.WaitGroup
		defer wg.Wait()
		var toClient sync.Mutex // server replies and the proxy's own
		wg.Go(func() {
			defer client.Close()
			buf := make([]byte, 64<<10)
			for {
				k, err := server.Read(buf)
				if k > 0 {
					toClient.Lock()
					_, werr := client.Write(buf[:k])
					toClient.Unlock()
					if werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
		defer server.Close()
		for {
			msg, err := readWireMessage(client)
			if err != nil {
				return
			}
			if cmd, ok := deniedCommand(msg, coll); ok {
				toClient.Lock()
				_, err = client.Write(unauthorizedReply(msg, cmd, coll))
				toClient.Unlock()
			} else {
				_, err = server.Write(msg)
			}
			if err != nil {
				return
			}
		}
	})
}

// opMsg is the wire protocol's OP_MSG opcode.
const opMsg = 2013

// readWireMessage reads one whole message: its length comes first.
func readWireMessage(r io.Reader) ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return nil, err
	}
	n := int(binary.LittleEndian.Uint32(size[:]))
	if n < 16 || n > 64<<20 {
		return nil, errors.New("bad message length")
	}
	msg := make([]byte, n)
	copy(msg, size[:])
	_, err := io.ReadFull(r, msg[4:])
	return msg, err
}

// deniedCommand reports whether msg is a write command on coll, and which.
func deniedCommand(msg []byte, coll string) (string, bool) {
	if binary.LittleEndian.Uint32(msg[12:16]) != opMsg || len(msg) < 21 {
		return "", false
	}
	rest := msg[20:] // after the header and the flags
	for len(rest) > 5 {
		kind := rest[0]
		size := int(binary.LittleEndian.Uint32(rest[1:5]))
		if size < 5 || size > len(rest)-1 {
			return "", false
		}
		if kind == 0 { // the command document
			elems, err := bson.Raw(rest[1 : 1+size]).Elements()
			if err != nil || len(elems) == 0 {
				return "", false
			}
			name := elems[0].Key()
			target, _ := elems[0].Value().StringValueOK()
			switch name {
			case "insert", "update", "delete", "findAndModify":
				return name, target == coll
			}
			return "", false
		}
		rest = rest[1+size:] // a document sequence
	}
	return "", false
}

// unauthorizedReply is the server's answer to a command its user may not
// run: ok 0, code 13.
func unauthorizedReply(req []byte, cmd, coll string) []byte {
	body, err := bson.Marshal(bson.D{
		{Key: "ok", Value: 0.0},
		{Key: "errmsg", Value: fmt.Sprintf("not authorized on outbox to execute command { %s: %q }", cmd, coll)},
		{Key: "code", Value: int32(13)},
		{Key: "codeName", Value: "Unauthorized"},
	})
	if err != nil {
		panic(err)
	}
	msg := make([]byte, 21, 21+len(body))
	binary.LittleEndian.PutUint32(msg[0:], uint32(21+len(body)))
	binary.LittleEndian.PutUint32(msg[4:], binary.LittleEndian.Uint32(req[4:8])^0x5a5a5a5a) // a request id of its own
	copy(msg[8:12], req[4:8])                                                               // responseTo: the request's id
	binary.LittleEndian.PutUint32(msg[12:], opMsg)
	// flags 0, then section kind 0
	return append(msg, body...)
}
