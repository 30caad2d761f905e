package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// layout is what every page's template gets.
type layout struct {
	// Base starts the links of the page's outbox (Console.baseOf), Root
	// those of the console's own files and sign-out (BasePath).
	Title, Page, Base, Root string
	// Outbox is the page's outbox, "" for the unnamed one; Outboxes
	// the selector's choices, set when there are several.
	Outbox         string
	Outboxes       []outboxChoice
	RefreshSeconds int
	Data           any
	// Error is why the page's data could not be read; the page says so
	// in place of its content.
	Error string
	Query url.Values
	// Writes says the console's actions are on: pages show their forms.
	Writes bool
	// CSRF is the session's token, which every form posts (OIDC); User
	// and Role who is signed in.
	CSRF, User, Role string
}

var funcs = template.FuncMap{
	"ago": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return shortDuration(time.Since(t)) + " ago"
	},
	"seconds": func(s float64) string { return shortDuration(time.Duration(s * float64(time.Second))) },
	"stamp": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"statusClass": statusClass,
	// query is a URL's query of the pairs that have a value. It is a
	// template.URL, encoded here, so that the template keeps its = and &.
	"query": func(pairs ...string) template.URL {
		q := url.Values{}
		for i := 0; i+1 < len(pairs); i += 2 {
			if pairs[i+1] != "" {
				q.Set(pairs[i], pairs[i+1])
			}
		}
		return template.URL(q.Encode()) //nolint:gosec // url.Values.Encode escaped every value
	},
	// group is the query of a failure group's events, its cause and
	// reason given even when empty, after a pair that has a value.
	"group": func(k, v string, g FailureGroup) template.URL {
		q := url.Values{"cause": {g.Cause}, "reason": {g.Reason}}
		if v != "" {
			q.Set(k, v)
		}
		return template.URL(q.Encode()) //nolint:gosec // url.Values.Encode escaped every value
	},
	// pathEscape makes an id one segment of a path: an id may hold a
	// slash, a question mark or a dot segment.
	"pathEscape": url.PathEscape,
	"sub":        func(a, b int) int { return a - b },
	"shellQuote": shellQuote,
	"list":       func(s ...string) []string { return s },
	"short":      cut,
	"ints":       ranges,
	"canRequeue": canRequeue,
	// listFilters are the events list's query the selector keeps.
	"listFilters": func() []string { return listFilters },
}

// parsePages parses each page with the layout.
func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for page := range titles {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("console: parse the %s page: %w", page, err)
		}
		pages[page] = t
	}
	return pages, nil
}

// layoutOf is the part of the layout of every page of r: its outbox,
// the selector's outboxes, and who is signed in.
func (c *Console) layoutOf(r *http.Request) layout {
	o := outboxOf(r)
	l := layout{
		Base: c.baseOf(o), Root: c.cfg.BasePath, Writes: c.writes(),
		CSRF: requesterOf(r).csrf, User: requesterOf(r).who, Role: requesterOf(r).role,
	}
	if o != nil {
		l.Outbox = o.Name
	}
	if len(c.outboxes) > 1 {
		l.Outboxes = c.outboxChoices()
	}
	return l
}

// render writes a page, or a plain error if its template fails (a bug).
func (c *Console) render(w http.ResponseWriter, code int, page string, l layout) {
	var buf bytes.Buffer
	if err := c.pages[page].Execute(&buf, l); err != nil {
		c.cfg.Logger.Error("console page did not render", "page", page, "error", err)
		http.Error(w, "the page did not render; the worker's log says why", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// shortDuration is d rounded for a person: 45s, 12m, 3h5m, 2d4h.
func shortDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

// cut is s cut to n runes, with an ellipsis.
func cut(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}

// ranges writes sorted partition numbers as ranges: 0-15, 20, 22-24.
func ranges(ps []int) string {
	var parts []string
	for i := 0; i < len(ps); {
		j := i
		for j+1 < len(ps) && ps[j+1] == ps[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", ps[i], ps[j]))
		} else {
			parts = append(parts, fmt.Sprint(ps[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}

// shellQuote quotes s for a POSIX shell, so that a command the console
// prints runs with s as one argument whatever it holds: ids come from
// producers. A plain id stays as it is.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/@+=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
