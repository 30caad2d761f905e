package ops

// The endpoints that answer per outbox: /readyz, /status and /trigger.
// Each takes ?outbox=NAME to answer for one outbox; without it they answer
// for all, and a worker of one outbox answers as it always has.

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/outboxrelay/outbox/events"
)

// chosen returns the outboxes a request is about: the one its ?outbox=
// names, or all (none, in a fleet that has found none to relay yet). It
// answers 404 itself, and returns false, for a name it does not know.
func (s *Server) chosen(w http.ResponseWriter, r *http.Request) ([]Outbox, bool) {
	s.mu.RLock()
	all := s.cfg.Outboxes
	s.mu.RUnlock()
	name := r.URL.Query().Get("outbox")
	if name == "" {
		return all, true
	}
	for _, o := range all {
		if o.Name == name {
			return []Outbox{o}, true
		}
	}
	writeJSON(w, http.StatusNotFound, map[string]any{"error": fmt.Sprintf("no outbox named %q", name)})
	return nil, false
}

// SetOutboxes replaces the outboxes the endpoints report on, as a reload
// of the worker's outboxes does; it refuses a list ServerConfig.Validate
// would.
func (s *Server) SetOutboxes(outboxes []Outbox) error {
	cfg := s.cfg
	cfg.Outboxes = outboxes
	if err := cfg.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	s.cfg.Outboxes = slices.Clone(outboxes)
	s.mu.Unlock()
	return nil
}

// readyz answers 200 while at least one of the chosen outboxes is ready,
// and names those that are not. A worker relays each outbox on its own: a
// tenant's database that is down stops that tenant's relay and no other,
// so it must not take every replica out of a rollout or a Service; the
// outboxes not ready are in the body, in /status, and in their own
// metrics and alerts. With ?outbox=NAME it answers for that outbox alone.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	outboxes, ok := s.chosen(w, r)
	if !ok {
		return
	}
	if len(outboxes) == 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "reason": noOutboxYet})
		return
	}
	reasons := s.notReady(r.Context(), outboxes)
	if len(reasons) < len(outboxes) {
		body := map[string]any{"ready": true}
		if len(reasons) > 0 {
			body["notReady"] = reasons
		}
		writeJSON(w, http.StatusOK, body)
		return
	}
	reason := reasons[outboxes[0].Name]
	if len(outboxes) > 1 {
		reason = "no outbox is ready"
	}
	writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "reason": reason, "notReady": reasons})
}

// noOutboxYet is why a worker that relays no outbox is not ready: a
// fleet whose patterns of databases have matched none yet, or whose
// clusters could not be listed. It has nothing to do, and says so,
// rather than pass for a worker that relays.
const noOutboxYet = "no outbox to relay yet: the fleet file's patterns of databases match none, or their clusters could not be listed"

// notReady checks the outboxes at once (each ping waits up to
// readyTimeout, and a probe waits for all of them) and returns why each
// that is not ready is not.
func (s *Server) notReady(ctx context.Context, outboxes []Outbox) map[string]string {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	reasons := map[string]string{}
	for _, o := range outboxes {
		wg.Go(func() {
			if why := o.notReady(ctx); why != "" {
				mu.Lock()
				reasons[o.Name] = why
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return reasons
}

func (o Outbox) notReady(ctx context.Context) string {
	if err := o.Store.Ping(ctx); err != nil {
		return "mongodb: " + err.Error()
	}
	if err := o.Broker.Ready(); err != nil {
		return "rabbitmq: " + err.Error()
	}
	if why := o.unowned(); why != "" {
		return "ownership: " + why
	}
	return ""
}

// unowned says why this replica relays nothing of the outbox although its
// database and broker answer: it has owned no partition of it for longer
// than a term. "" when it owns one, or has owned none for a term at most
// (it is starting, or its partitions are moving).
func (o Outbox) unowned() string {
	if o.Owner == nil {
		return ""
	}
	d, err := o.Owner.Unowned()
	if d <= o.Owner.TermLength() {
		return ""
	}
	head := fmt.Sprintf("no partition owned for %s, longer than a term (%s): ", d.Round(time.Second), o.Owner.TermLength())
	if err != nil {
		return head + "the ownership rounds fail (can this worker write the owners collection?): " + err.Error()
	}
	return head + fmt.Sprintf("other replicas hold every partition (more replicas than the %d partitions?)", events.Partitions)
}

// status answers from the samplers' last samples, whose figures are as of
// sampledAt: it sends no query, so that however often it is read it adds
// nothing to the databases' load. For one outbox (the worker's only one,
// or the one ?outbox= names) it answers that outbox's body, with 503 and
// an error before its first sample; for several, 200 with each outbox's
// body under outboxes.
func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	outboxes, ok := s.chosen(w, r)
	if !ok {
		return
	}
	if len(outboxes) == 1 {
		body, ok := s.outboxStatus(outboxes[0])
		writeJSON(w, map[bool]int{true: http.StatusOK, false: http.StatusServiceUnavailable}[ok], body)
		return
	}
	bodies := make([]any, len(outboxes))
	for i, o := range outboxes {
		bodies[i], _ = s.outboxStatus(o)
	}
	writeJSON(w, http.StatusOK, map[string]any{"workerId": s.cfg.WorkerID, "build": s.cfg.Build, "outboxes": bodies})
}

// outboxStatus is o's body of /status, and whether it has a sample.
func (s *Server) outboxStatus(o Outbox) (any, bool) {
	local := statusLocal{
		Outbox:         o.Name,
		WorkerID:       s.cfg.WorkerID,
		Build:          s.cfg.Build,
		LastClaimAt:    timeOrNil(o.Claimer.LastRun()),
		BatchLimit:     o.Claimer.BatchLimit(),
		LastRecoveryAt: timeOrNil(o.Recovery.LastRun()),
	}
	if o.BrokerNode != nil {
		node := o.BrokerNode() // "" while not connected
		local.BrokerNode = &node
	}
	if o.WakeUp != nil {
		local.WakeUp = o.WakeUp()
	}
	if o.Owner != nil {
		d, err := o.Owner.Unowned()
		own := &ownershipStatus{Partitions: len(o.Owner.Owned()), UnownedSeconds: d.Seconds(), NotReady: o.unowned()}
		if err != nil {
			own.LastError = err.Error()
		}
		local.Ownership = own
	}
	sample, ok := o.Samples.Latest()
	if !ok {
		return struct {
			Error string `json:"error"`
			statusLocal
		}{"no sample of the outbox yet; one has been asked for", local}, false
	}
	now := s.cfg.Now
	if o.Now != nil {
		now = o.Now
	}
	stats := sample.Stats
	body := statusBody{
		statusLocal:         local,
		Counts:              make(map[string]int64, len(stats.Counts)),
		OldestNewAgeSeconds: stats.OldestNewAge(sample.At).Seconds(),
		StaleProcessing:     stats.Stale,
		SampledAt:           sample.At.UTC(),
		SampleAgeSeconds:    max(now().Sub(sample.At), 0).Seconds(),
		PausedTypes:         sample.Paused,
	}
	if body.PausedTypes == nil {
		body.PausedTypes = []events.Pause{}
	}
	for _, status := range events.CountedStatuses {
		body.Counts[string(status)] = stats.Counts[status]
	}
	if held := sample.Held; held != nil {
		body.HeldAggregates = held.Aggregates
		body.HeldCapped = held.Capped
		if sample.HeldAt.Before(sample.At) {
			body.HeldSampledAt = timeOrNil(sample.HeldAt.UTC())
		}
		body.OldestHeldAgeSeconds = held.OldestAge(sample.At).Seconds()
	}
	return body, true
}

// trigger asks for a claim now in the chosen outboxes, if the client may
// (authorizeTrigger). In an outbox whose claims back off after failed
// runs it asks for nothing: a request must not add a run against a
// database that the backoff spares. The answer is 202 either way, since
// the events are claimed at the first tick after the backoff; it says
// which, and for several outboxes says it of each.
func (s *Server) trigger(w http.ResponseWriter, r *http.Request) {
	if !s.authorizeTrigger(w, r) {
		return
	}
	outboxes, ok := s.chosen(w, r)
	if !ok {
		return
	}
	each := map[string]any{}
	anyTriggered := false
	for _, o := range outboxes {
		if left := o.Claimer.Wake(); left > 0 {
			each[o.Name] = map[string]any{"triggered": false, "backoffSeconds": left.Seconds()}
			continue
		}
		anyTriggered = true
		each[o.Name] = map[string]any{"triggered": true}
	}
	if len(outboxes) == 1 {
		writeJSON(w, http.StatusAccepted, each[outboxes[0].Name])
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"triggered": anyTriggered, "outboxes": each})
}
