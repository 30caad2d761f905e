package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/outboxrelay/outbox/internal/rule"
	"github.com/outboxrelay/outbox/ops"
)

// A console serves one outbox, or every outbox of a fleet. With several,
// each page and action is of one outbox, named in the path:
// /o/<name>/events?status=FAILED, so that links, forms, redirects and
// bookmarks keep it, and an action reaches the outbox its page showed
// and no other. A request without the prefix names no outbox: a page is
// sent to the first available outbox's, and anything else is refused.
// With one outbox, the paths are as they always were. An outbox whose
// Ready says it cannot be served now answers 503 alone.

// outboxPathPrefix starts the path of an outbox's pages.
const outboxPathPrefix = "/o/"

// Outbox is one outbox a console serves: what its pages read and its
// actions change. Config.Outboxes lists them; a console of one outbox
// may set Config.Store and the fields beside it instead.
type Outbox struct {
	// Name names the outbox in the selector and in its pages' paths
	// (/o/<Name>/), as the fleet file does. Required, and unique, with
	// several outboxes; "" for the one outbox of a worker without a
	// fleet file, which shows no name.
	Name string
	// Store is read by every page of the outbox. Required.
	Store Store
	// Samples, Lists, Owners, TermLength and FailedHolds are Config's,
	// for this outbox: see there.
	Samples     ops.SampleSource
	Lists       ListSource
	Owners      OwnersReader
	TermLength  time.Duration
	FailedHolds bool
	// Writer changes the outbox as its actions ask; nil leaves it
	// read-only. Set on every outbox or on none.
	Writer Writer
	// Now is the clock of the outbox's cluster: its ages, its held test
	// and the times its actions record go by it. Outboxes on several
	// clusters each give their own, for the servers' clocks may differ.
	// Defaults to Config.Now.
	Now func() time.Time
	// Ready, when set, says whether the outbox can be served now: an
	// error (its database has not answered yet) makes each of its pages,
	// API reads and actions answer 503 naming the outbox and the error,
	// and the selector mark it unavailable, while the other outboxes are
	// served. It is asked at every request, so it must be cheap.
	// Defaults to nil: always served.
	Ready func() error
}

// served is an outbox as the console serves it: with the time of this
// console's last action on it, which tells the lists its source read
// before that action from those it read since.
type served struct {
	Outbox
	acted atomic.Int64 // UnixNano by Config.Now; 0 before any action
}

// outboxes is Config.Outboxes, or the one outbox Config.Store and the
// fields beside it describe.
func (c *Config) outboxes() []Outbox {
	if len(c.Outboxes) > 0 || c.Store == nil {
		return c.Outboxes
	}
	return []Outbox{{
		Store: c.Store, Samples: c.Samples, Lists: c.Lists, Owners: c.Owners,
		TermLength: c.TermLength, FailedHolds: c.FailedHolds, Writer: c.Writer,
	}}
}

// outboxRules checks each outbox as Validate checks the rest.
func outboxRules(c Config) []*rule.Error {
	list := c.outboxes()
	rules := []*rule.Error{
		rule.Check("Outboxes", len(list) > 0, "none", "at least one, or Store"),
		rule.Check("Store", len(c.Outboxes) == 0 || c.Store == nil && c.Samples == nil && c.Lists == nil && c.Owners == nil && c.Writer == nil, "set",
			"unset with Outboxes, as Samples, Lists, Owners and Writer: each outbox has its own"),
	}
	names := map[string]bool{}
	for i, o := range list {
		field := func(name string) string { return fmt.Sprintf("Outboxes[%d].%s", i, name) }
		if len(c.Outboxes) == 0 {
			field = func(name string) string { return name }
		}
		rules = append(rules,
			rule.Required(field("Store"), o.Store != nil),
			rule.Required(field("Samples"), o.Samples != nil),
			rule.Check(field("TermLength"), o.Owners == nil || o.TermLength > 0, o.TermLength, "more than 0 with Owners"),
			rule.Check(field("Name"), len(list) == 1 || o.Name != "", o.Name, "set with several outboxes"),
			rule.Check(field("Name"), url.PathEscape(o.Name) == o.Name && o.Name != "." && o.Name != "..", o.Name, "a name that is one segment of a path as it is"),
			rule.Check(field("Name"), !names[o.Name], o.Name, "unique"),
			rule.Check(field("Writer"), (o.Writer != nil) == (list[0].Writer != nil), "set on some", "set on every outbox or on none"),
		)
		names[o.Name] = true
	}
	return rules
}

// errUnavailable is a request for an outbox whose Ready says it cannot
// be served now: 503, like a database's error.
type errUnavailable struct{ msg string }

func (e errUnavailable) Error() string { return e.msg }

// unavailable is why o cannot be served now, nil when it can.
func unavailable(o *served) error {
	if o == nil || o.Ready == nil {
		return nil
	}
	err := o.Ready()
	if err == nil {
		return nil
	}
	name := "this outbox"
	if o.Name != "" {
		name = "outbox " + strconv.Quote(o.Name)
	}
	return errUnavailable{fmt.Sprintf("%s is unavailable: %v. The console keeps trying and serves it as soon as its database answers; nothing was read or changed", name, err)}
}

// serveUnavailable answers a request for an outbox that cannot be
// served now: 503, as JSON to the API, as a page to a browser that
// refreshes itself, so that it shows the outbox once it is back.
func (c *Console) serveUnavailable(w http.ResponseWriter, r *http.Request, err error) {
	w.Header().Set("Retry-After", strconv.Itoa(int(c.cfg.Refresh/time.Second)))
	if strings.HasPrefix(r.URL.Path, "/api/") || !wantsPage(r) && r.Method == http.MethodGet {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	l := c.layoutOf(r)
	l.Title, l.Page, l.Error = "Outbox unavailable", "unavailable", err.Error()
	// A filtered list is a search, shown once (servePage): refreshed,
	// it would run at every refresh once the outbox is back.
	if r.Method == http.MethodGet && !filtered(r.URL.Query()) {
		l.RefreshSeconds = int(c.cfg.Refresh / time.Second)
	}
	c.render(w, http.StatusServiceUnavailable, "event", l)
}

// now is the time by the clock of r's outbox's cluster.
func (c *Console) now(r *http.Request) time.Time {
	if o := outboxOf(r); o != nil {
		return o.Now()
	}
	return c.cfg.Now()
}

// outboxKey carries the request's outbox in its context.
type outboxKey struct{}

// outboxOf is the outbox r is for (routeOutbox put it there).
func outboxOf(r *http.Request) *served {
	o, _ := r.Context().Value(outboxKey{}).(*served)
	return o
}

// errNoOutbox is a request for an outbox the console does not serve.
type errNoOutbox struct{ msg string }

func (e errNoOutbox) Error() string { return e.msg }

// routeOutbox finds the outbox r's path names, strips its prefix and
// carries the outbox in r's context. With one outbox, a path without
// the prefix is that outbox's. With several, it is no outbox's: ok
// false and a nil error then, and the caller sends a page to the first
// outbox. A name the console does not serve is an errNoOutbox.
func (c *Console) routeOutbox(r *http.Request) (*http.Request, bool, error) {
	rest, found := strings.CutPrefix(r.URL.Path, outboxPathPrefix)
	if !found {
		if len(c.outboxes) > 1 {
			return r, false, nil
		}
		return c.withOutbox(r, c.outboxes[0], ""), true, nil
	}
	name, _, _ := strings.Cut(rest, "/")
	i := slices.IndexFunc(c.outboxes, func(o *served) bool { return o.Name == name })
	if i < 0 {
		return r, false, errNoOutbox{fmt.Sprintf("refused: this console serves no outbox %s (it serves %s): nothing was read or changed",
			strconv.Quote(name), strings.Join(c.outboxNames(), ", "))}
	}
	return c.withOutbox(r, c.outboxes[i], outboxPathPrefix+name), true, nil
}

// withOutbox is r for the outbox o, its path without prefix. The
// escaped path loses the same prefix (a name is the same escaped), so
// that an id escaped in a segment stays one segment.
func (c *Console) withOutbox(r *http.Request, o *served, prefix string) *http.Request {
	r = r.WithContext(context.WithValue(r.Context(), outboxKey{}, o))
	if prefix == "" {
		return r
	}
	u := *r.URL
	u.Path = "/" + strings.TrimPrefix(strings.TrimPrefix(u.Path, prefix), "/")
	if u.RawPath != "" {
		u.RawPath = "/" + strings.TrimPrefix(strings.TrimPrefix(u.RawPath, prefix), "/")
	}
	r.URL = &u
	return r
}

// outboxNames are the names of the outboxes the console serves, in
// their order.
func (c *Console) outboxNames() []string {
	names := make([]string, len(c.outboxes))
	for i, o := range c.outboxes {
		names[i] = o.Name
	}
	return names
}

// baseOf is the path o's pages start with: BasePath, and with several
// outboxes /o/<name>.
func (c *Console) baseOf(o *served) string {
	if len(c.outboxes) == 1 || o == nil {
		return c.cfg.BasePath
	}
	return c.cfg.BasePath + outboxPathPrefix + o.Name
}

// serveUnrouted answers a request that names no outbox of several: a
// page is sent to the same page of the first available outbox, so that
// a bookmark of a console that served one outbox still opens; an API
// read or an action is refused, for it cannot be known which outbox it
// meant.
func (c *Console) serveUnrouted(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && !strings.HasPrefix(r.URL.Path, "/api/") {
		http.Redirect(w, r, c.baseOf(c.firstServable())+r.URL.RequestURI(), http.StatusSeeOther)
		return
	}
	err := errBadRequest{fmt.Sprintf("refused: name the outbox in the path, %s<name>%s (this console serves %s): nothing was read or changed",
		c.cfg.BasePath+outboxPathPrefix, r.URL.Path, strings.Join(c.outboxNames(), ", "))}
	c.answerRefused(w, r, err)
}

// firstServable is the first outbox that can be served now, or the
// first outbox when none can: a bookmark opens an outbox it can show.
func (c *Console) firstServable() *served {
	for _, o := range c.outboxes {
		if unavailable(o) == nil {
			return o
		}
	}
	return c.outboxes[0]
}

// answerRefused answers a request refused before it reached a page: as
// JSON to the API, as a page to a browser.
func (c *Console) answerRefused(w http.ResponseWriter, r *http.Request, err error) {
	if strings.HasPrefix(r.URL.Path, "/api/") || !wantsPage(r) && r.Method == http.MethodGet {
		writeJSON(w, status(err), map[string]string{"error": err.Error()})
		return
	}
	c.refuse(w, r, err)
}

// outboxPages are the pages the selector may send a browser to, by the
// name layout.Page gives them: the lists, not one event or action,
// which another outbox does not have.
var outboxPages = map[string]string{
	"overview": "/", "events": "/events?status=FAILED", "failures": "/failures", "held": "/held", "audit": "/audit",
}

// switchOutbox is the selector's form: it sends the browser to the page
// of the outbox chosen, the page it was on when that is a list.
func (c *Console) switchOutbox(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("outbox")
	i := slices.IndexFunc(c.outboxes, func(o *served) bool { return o.Name == name })
	if i < 0 {
		c.refuse(w, r, errNoOutbox{fmt.Sprintf("this console serves no outbox %s (it serves %s)", strconv.Quote(name), strings.Join(c.outboxNames(), ", "))})
		return
	}
	page, ok := outboxPages[r.URL.Query().Get("page")]
	if !ok {
		page = "/"
	}
	if r.URL.Query().Get("page") == "events" {
		page = "/events?" + keptFilters(r.URL.Query()).Encode()
	}
	http.Redirect(w, r, c.baseOf(c.outboxes[i])+page, http.StatusSeeOther)
}

// listFilters are the events list's query that the selector keeps when
// it opens another outbox: the list of the same status and filters
// there. The cursor (after) is not kept: it points into this outbox's
// list.
var listFilters = []string{"status", "type", "aggregate", "error", "olderThan", "cause", "reason"}

// keptFilters is q's listFilters that have a value, with a status
// (FAILED, the list's default) in any case.
func keptFilters(q url.Values) url.Values {
	kept := url.Values{"status": {"FAILED"}}
	for _, k := range listFilters {
		if v := q.Get(k); v != "" {
			kept.Set(k, v)
		}
	}
	return kept
}

// outboxChoice is an outbox in the selector.
type outboxChoice struct {
	Name        string
	Unavailable bool
}

// outboxChoices are the selector's choices, each marked when it cannot
// be served now.
func (c *Console) outboxChoices() []outboxChoice {
	choices := make([]outboxChoice, len(c.outboxes))
	for i, o := range c.outboxes {
		choices[i] = outboxChoice{Name: o.Name, Unavailable: unavailable(o) != nil}
	}
	return choices
}
