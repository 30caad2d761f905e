package deploy

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

const dashboardFile = "grafana/outbox.json"

type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's panels
}

// grafanaVariables are what Grafana puts in place of the variables the
// dashboard's queries use; any other $ is an error.
var grafanaVariables = strings.NewReplacer(
	"$__rate_interval", "5m",
	"$__interval", "1m",
	"${job}", "outbox-worker",
	"$job", "outbox-worker",
	"$outbox", ".*",
)

// TestDashboard parses the Grafana dashboard and checks every query: it
// is PromQL, it uses only metrics the worker exports (and up) with labels
// they have, and together the queries cover what an operator watches.
func TestDashboard(t *testing.T) {
	t.Parallel()
	var d dashboard
	decodeFile(t, dashboardFile, json.Unmarshal, &d)
	if d.Title == "" || d.UID == "" {
		t.Errorf("dashboard title %q, uid %q: want both", d.Title, d.UID)
	}
	exported := workerMetrics(t)
	exported["up"] = map[string]bool{}

	for _, v := range d.Templating.List {
		if m := regexp.MustCompile(`^label_values\((\w+)[{,]`).FindStringSubmatch(v.Definition); m != nil && exported[m[1]] == nil {
			t.Errorf("variable %s queries %s, which the worker does not export", v.Name, m[1])
		}
	}

	ids := map[int]string{}
	used := map[string]bool{}
	perReplica := 0
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if prev, ok := ids[p.ID]; ok {
				t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
			}
			ids[p.ID] = p.Title
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: datasource must be the ${datasource} variable", p.Title)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no queries", p.Title)
			}
			for _, tg := range p.Targets {
				q := grafanaVariables.Replace(tg.Expr)
				if strings.Contains(q, "$") {
					t.Errorf("panel %q query %s: unknown variable in %q", p.Title, tg.RefID, tg.Expr)
					continue
				}
				sels, err := selectors(q)
				if err != nil {
					t.Errorf("panel %q query %s: %v", p.Title, tg.RefID, err)
					continue
				}
				for _, s := range sels {
					lbls, ok := exported[s.name]
					if !ok {
						t.Errorf("panel %q queries %s, which the worker does not export", p.Title, s.name)
						continue
					}
					used[s.name] = true
					for _, l := range s.labelNames() {
						if !lbls[l] && !targetLabels[l] {
							t.Errorf("panel %q uses label %q of %s, which has labels %v", p.Title, l, s.name, keys(lbls))
						}
						if l == "instance" || l == "pod" {
							perReplica++
						}
					}
				}
			}
		}
	}
	walk(d.Panels)

	for _, m := range []string{
		"outbox_events", "outbox_oldest_new_event_age_seconds", "outbox_events_published_total",
		"outbox_publish_latency_seconds_bucket", "outbox_stale_processing_events", "outbox_events_failed_total",
	} {
		if !used[m] {
			t.Errorf("no panel queries %s", m)
		}
	}
	if perReplica == 0 {
		t.Error("no panel shows replicas apart (by instance or pod)")
	}
	// Every series but the process's carries the outbox: a panel that
	// did not filter on the outbox variable would mix the fleet's
	// outboxes whatever the operator chose.
	for _, tg := range allTargets(d.Panels) {
		for _, m := range regexp.MustCompile(`outbox_\w+\{[^}]*\}`).FindAllString(tg, -1) {
			if !strings.Contains(m, `outbox=~"$outbox"`) {
				t.Errorf("query %s: selector %s does not filter on $outbox", tg, m)
			}
		}
	}
}

// allTargets returns the query of every panel, rows' panels included.
func allTargets(ps []panel) []string {
	var out []string
	for _, p := range ps {
		out = append(out, allTargets(p.Panels)...)
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	return out
}
