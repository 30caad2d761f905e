package console_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/outboxrelay/outbox/console"
)

const token = "0123456789abcdef-token"

// setupWrites returns a console with its actions on, over a fakeStore.
func setupWrites(t *testing.T) (*httptest.Server, *fakeStore) {
	t.Helper()
	store := newFakeStore(t)
	return serveFake(t, store, console.Config{Token: token, RequeuePerSecond: 7}, true), store
}

// request sends method to path as user with password pass (no
// authentication when user is ""), with form as its body and headers.
func request(t *testing.T, srv *httptest.Server, method, path, user, pass string, form url.Values, headers map[string]string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	client := *srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body), resp.Header
}

// TestActionsNeedTheToken: with the actions on, every request gives the
// token, page views included.
func TestActionsNeedTheToken(t *testing.T) {
	t.Parallel()
	srv, _ := setupWrites(t)
	code, _, h := request(t, srv, http.MethodGet, "/", "", "", nil, nil)
	if code != http.StatusUnauthorized || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Basic") {
		t.Errorf("GET / without credentials = %d (WWW-Authenticate %q), want 401 asking for Basic", code, h.Get("WWW-Authenticate"))
	}
	if code, _, _ := request(t, srv, http.MethodGet, "/", "ana", "wrong-token-wrong-token", nil, nil); code != http.StatusUnauthorized {
		t.Errorf("GET / with a wrong token = %d, want 401", code)
	}
	code, body, _ := request(t, srv, http.MethodGet, "/events/evil-1", "ana", token, nil, nil)
	if code != http.StatusOK || !strings.Contains(body, "actions on") || !strings.Contains(body, `action="/events/evil-1/requeue"`) {
		t.Errorf("GET the event with the token = %d; want its page with the requeue form", code)
	}
}

// TestRequeueAndSkipFromTheEventPage: each takes a reason and is
// recorded with who did it; without a reason nothing is done.
func TestRequeueAndSkipFromTheEventPage(t *testing.T) {
	t.Parallel()
	srv, store := setupWrites(t)
	store.matching = 1
	if code, body, _ := request(t, srv, http.MethodPost, "/events/evil-1/requeue", "ana", token, url.Values{"reason": {"  "}}, nil); code != http.StatusBadRequest || !strings.Contains(body, "reason is required") {
		t.Errorf("requeue without a reason = %d, want 400 asking for one", code)
	}
	code, _, h := request(t, srv, http.MethodPost, "/events/evil-1/requeue", "ana", token, url.Values{"reason": {"route added"}}, nil)
	if code != http.StatusSeeOther || h.Get("Location") != "/events/evil-1" {
		t.Errorf("requeue = %d to %q, want 303 to the event", code, h.Get("Location"))
	}
	if code, _, _ := request(t, srv, http.MethodPost, "/events/evil-1/skip", "bo", token, url.Values{"reason": {"obsolete"}}, nil); code != http.StatusSeeOther {
		t.Errorf("skip = %d, want 303", code)
	}
	if len(store.requeues) != 1 || len(store.requeues[0].IDs) != 1 || store.requeues[0].IDs[0] != "evil-1" || len(store.skips) != 1 {
		t.Fatalf("requeues %+v, skips %v; want evil-1 requeued once and skipped once", store.requeues, store.skips)
	}
	got := store.actions
	if len(got) != 2 || got[1].By != "ana (shared token)" || got[1].Name != "requeue" || got[1].Reason != "route added" || got[1].Source != "console" ||
		got[1].Count != 1 || !got[1].At.Equal(now) || got[0].By != "bo (shared token)" || got[0].Name != "skip" {
		t.Errorf("audit = %+v", got)
	}
	_, body, _ := request(t, srv, http.MethodGet, "/audit", "ana", token, nil, nil)
	if !strings.Contains(body, "route added") || !strings.Contains(body, "obsolete") {
		t.Errorf("the audit page does not list both actions")
	}
}

// TestCrossSiteRequestsAreRefused: a page of another site cannot make the
// operator's browser act, credentials and all.
func TestCrossSiteRequestsAreRefused(t *testing.T) {
	t.Parallel()
	srv, store := setupWrites(t)
	store.matching = 1
	for _, h := range []map[string]string{
		{"Origin": "https://evil.example"},
		{"Sec-Fetch-Site": "cross-site"},
		{"Sec-Fetch-Site": "same-site"},
	} {
		if code, _, _ := request(t, srv, http.MethodPost, "/events/evil-1/requeue", "ana", token, url.Values{"reason": {"x"}}, h); code != http.StatusForbidden {
			t.Errorf("POST with %v = %d, want 403", h, code)
		}
	}
	u, _ := url.Parse(srv.URL)
	if code, _, _ := request(t, srv, http.MethodPost, "/events/evil-1/requeue", "ana", token, url.Values{"reason": {"x"}},
		map[string]string{"Origin": "http://" + u.Host, "Sec-Fetch-Site": "same-origin"}); code != http.StatusSeeOther {
		t.Errorf("POST from the console's own page = %d, want 303", code)
	}
	if len(store.requeues) != 1 {
		t.Errorf("%d requeues done, want only the same-origin one", len(store.requeues))
	}
}

// previewIn is the id of the preview the console holds, which a
// preview page's form posts back.
func previewIn(t *testing.T, page string) string {
	t.Helper()
	m := regexp.MustCompile(`name="preview" value="([^"]+)"`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no preview id in the preview page:\n%s", page)
	}
	return m[1]
}

// TestGroupRequeuePreviewsItsSelection: the preview of a group's requeue
// chooses the group by its cause and reason as given, lists the events
// it will touch, and is not refreshed; the requeue acts on the previewed
// events, spread at the configured rate, and is audited with its count.
func TestGroupRequeuePreviewsItsSelection(t *testing.T) {
	t.Parallel()
	srv, store := setupWrites(t)
	store.matching = 12
	const cause = `broker returned <n> NO_ROUTE for "…" (.*)`
	q := url.Values{"cause": {cause}, "reason": {"returned"}}
	code, body, _ := request(t, srv, http.MethodGet, "/requeue?"+q.Encode(), "ana", token, nil, nil)
	if code != http.StatusOK || !strings.Contains(body, "12 FAILED events") || !strings.Contains(body, "7 a second") ||
		!strings.Contains(body, "e-0") || !strings.Contains(body, `data-refresh="0"`) {
		t.Fatalf("preview page = %d; want the count, the rate, the first ids and no refresh:\n%s", code, body)
	}
	if sel := store.selections; len(sel) != 1 || sel[0].Group == nil || sel[0].Group.Cause != cause || sel[0].Group.Reason != "returned" {
		t.Errorf("selections = %+v, want the group by its cause and reason, literally", sel)
	}
	if len(store.requeues) != 0 || len(store.actions) != 0 {
		t.Fatal("the preview page acted")
	}
	form := url.Values{"reason": {"route added"}}
	if code, body, _ := request(t, srv, http.MethodPost, "/requeue", "ana", token, form, nil); code != http.StatusBadRequest || !strings.Contains(body, "preview the action again") {
		t.Errorf("a requeue without a selection = %d, want 400 asking to preview: %s", code, body)
	}
	form.Set("preview", previewIn(t, body))
	store.matching = 30 // the group grew since: the requeue still acts on the preview
	if code, _, h := request(t, srv, http.MethodPost, "/requeue", "ana", token, form, nil); code != http.StatusSeeOther || h.Get("Location") != "/audit" {
		t.Errorf("confirmed requeue = %d to %q, want 303 to the audit", code, h.Get("Location"))
	}
	if r := store.requeues; len(r) != 1 || len(r[0].Selected) != 12 || r[0].Selected[11] != "e-11" || r[0].PerSecond != 7 || !r[0].Now.Equal(now) || r[0].Type != "" || r[0].All {
		t.Errorf("requeues = %+v, want one of the 12 previewed ids, 7 a second from now", r)
	}
	if a := store.actions; len(a) != 1 || a[0].Count != 12 || a[0].State != "done" || !strings.Contains(a[0].Target, "12 previewed") {
		t.Errorf("audit = %+v", a)
	}
}

// TestPreviewIsCapped: one action touches at most ActionMax events, the
// oldest; a selection posted larger than that is refused.
func TestPreviewIsCapped(t *testing.T) {
	t.Parallel()
	store := newFakeStore(t)
	store.matching = 12
	srv := serveFake(t, store, console.Config{Token: token, ActionMax: 5}, true)
	_, body, _ := request(t, srv, http.MethodGet, "/requeue?cause=x&reason=", "ana", token, nil, nil)
	if !strings.Contains(body, "the oldest 5 of the 12") {
		t.Fatalf("a preview of more than ActionMax does not say it takes the oldest 5:\n%s", body)
	}
	sel := previewIn(t, body)
	if code, _, _ := request(t, srv, http.MethodPost, "/requeue", "ana", token, url.Values{"preview": {sel}, "reason": {"r"}}, nil); code != http.StatusSeeOther {
		t.Errorf("the capped requeue = %d, want 303", code)
	}
	if r := store.requeues; len(r) != 1 || len(r[0].Selected) != 5 {
		t.Errorf("requeues = %+v, want the 5 previewed", r)
	}
}

// TestReadOnlyShowsNoAction: read-only, the pages offer no form and the
// audit page still lists what the CLI did.
func TestReadOnlyShowsNoAction(t *testing.T) {
	t.Parallel()
	srv, _ := setup(t)
	for _, path := range []string{"/outbox/events/evil-1", "/outbox/failures"} {
		_, body, _ := get(t, srv, path)
		if strings.Contains(body, "<form class=\"action\"") || strings.Contains(body, "Requeue group") {
			t.Errorf("GET %s: an action is offered on a read-only console", path)
		}
	}
	if code, _, _ := get(t, srv, "/outbox/requeue?cause=x"); code != http.StatusNotFound {
		t.Errorf("the group requeue page on a read-only console = %d, want 404", code)
	}
	if code, _, _ := get(t, srv, "/outbox/audit"); code != http.StatusOK {
		t.Errorf("the audit page on a read-only console = %d, want 200", code)
	}
}

// TestSkipAGroupOrASelection: a group or the events selected on the list
// are skipped as a requeue is done: previewed, then the previewed ones,
// with a reason, audited.
func TestSkipAGroupOrASelection(t *testing.T) {
	t.Parallel()
	srv, store := setupWrites(t)
	store.matching = 3
	_, body, _ := request(t, srv, http.MethodGet, "/events?status=FAILED", "ana", token, nil, nil)
	if !strings.Contains(body, `type="checkbox" name="id" value="evil-1"`) || !strings.Contains(body, `formaction="/skip"`) {
		t.Fatalf("the FAILED events list offers no selection:\n%s", body)
	}
	code, body, _ := request(t, srv, http.MethodGet, "/skip?id=evil-1&id=ok-2", "ana", token, nil, nil)
	if code != http.StatusOK || !strings.Contains(body, "will be skipped") || !strings.Contains(body, "Skip these 3 events") {
		t.Fatalf("skip preview = %d:\n%s", code, body)
	}
	if sel := store.selections; len(sel) != 1 || strings.Join(sel[0].IDs, ",") != "evil-1,ok-2" || sel[0].Group != nil {
		t.Errorf("selections = %+v, want the two ids", sel)
	}
	form := url.Values{"preview": {previewIn(t, body)}, "reason": {"compensated by hand"}}
	if code, _, _ := request(t, srv, http.MethodPost, "/skip", "ana", token, form, nil); code != http.StatusSeeOther {
		t.Errorf("skip = %d, want 303", code)
	}
	if strings.Join(store.skips, ",") != "e-0,e-1,e-2" {
		t.Errorf("skipped %v, want the 3 previewed", store.skips)
	}
	if a := store.actions; len(a) != 1 || a[0].Name != "skip" || a[0].Count != 3 || a[0].Reason != "compensated by hand" {
		t.Errorf("audit = %+v", a)
	}
	_, body, _ = request(t, srv, http.MethodGet, "/failures", "ana", token, nil, nil)
	if !strings.Contains(body, `href="/skip?cause=`) {
		t.Errorf("the failures page offers no skip of a group")
	}
}
