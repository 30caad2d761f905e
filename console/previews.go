package console

import (
	"crypto/rand"
	"encoding/base64"
	"sync"
	"time"
)

// A bulk action acts on a preview the console holds, never on what a
// client posts: the preview GET keeps the exact _ids it selected (as
// stored: strings, ObjectIDs), who asked, for which action and until
// when, under a random id; the confirming POST names that id alone, and
// only the user who previewed, for that action, before it expires, may
// use it, once. A client therefore cannot widen an action (a regular
// expression or an operator among the ids), nor act on another user's
// preview, nor replay one. The previews live in this process: behind a
// load balancer, the POST must reach the console that showed the
// preview (one console, or sticky sessions); elsewhere it is refused as
// expired, and the operator previews again.

// Defaults and bounds of the held previews.
const (
	// PreviewTTLDefault is how long a preview may be confirmed.
	PreviewTTLDefault = 10 * time.Minute
	// previewsPerUser bounds the previews one user holds at once; the
	// oldest is forgotten first.
	previewsPerUser = 20
	// previewsMax bounds the previews the console holds in all.
	previewsMax = 2000
)

// heldPreview is what a preview showed, as the console keeps it.
type heldPreview struct {
	// outbox is the outbox previewed: the preview is confirmed on its
	// page alone, and acts on it alone.
	user, action, outbox string
	// ids are the events' _ids as stored, exactly those the preview
	// selected.
	ids []any
	// target says how they were chosen, for the audit: derived from the
	// preview's own query, never from the confirming form.
	target  string
	created time.Time
	expires time.Time
}

// previewBook holds previews under random ids until they are used or
// expire.
type previewBook struct {
	ttl time.Duration
	now func() time.Time

	mu    sync.Mutex
	held  map[string]heldPreview
	order []string // ids, oldest first
}

func newPreviewBook(ttl time.Duration, now func() time.Time) *previewBook {
	return &previewBook{ttl: ttl, now: now, held: map[string]heldPreview{}}
}

// hold keeps p and returns the id its form posts back, and when it
// expires.
func (b *previewBook) hold(p heldPreview) (string, time.Time) {
	var raw [18]byte
	_, _ = rand.Read(raw[:]) // crypto/rand.Read does not fail
	id := base64.RawURLEncoding.EncodeToString(raw[:])
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	p.created, p.expires = now, now.Add(b.ttl)
	b.dropExpired(now)
	for b.count(p.user) >= previewsPerUser {
		b.forget(b.oldestOf(p.user))
	}
	for len(b.order) >= previewsMax {
		b.forget(b.order[0])
	}
	b.held[id] = p
	b.order = append(b.order, id)
	return id, p.expires
}

// take returns the preview id names and forgets it, when user holds it
// for action on outbox and it has not expired; otherwise false, and a
// preview of another user, action or outbox stays for its owner.
func (b *previewBook) take(id, user, action, outbox string) (heldPreview, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dropExpired(b.now())
	p, ok := b.held[id]
	if !ok || p.user != user || p.action != action || p.outbox != outbox {
		return heldPreview{}, false
	}
	b.forget(id)
	return p, true
}

// count is how many previews user holds. b.mu is held.
func (b *previewBook) count(user string) int {
	n := 0
	for _, id := range b.order {
		if b.held[id].user == user {
			n++
		}
	}
	return n
}

// oldestOf is the id of user's oldest preview. b.mu is held.
func (b *previewBook) oldestOf(user string) string {
	for _, id := range b.order {
		if b.held[id].user == user {
			return id
		}
	}
	return ""
}

// forget drops the preview id. b.mu is held.
func (b *previewBook) forget(id string) {
	delete(b.held, id)
	for i, other := range b.order {
		if other == id {
			b.order = append(b.order[:i], b.order[i+1:]...)
			return
		}
	}
}

// dropExpired forgets the previews past their expiry. b.mu is held.
func (b *previewBook) dropExpired(now time.Time) {
	kept := b.order[:0]
	for _, id := range b.order {
		if now.Before(b.held[id].expires) {
			kept = append(kept, id)
			continue
		}
		delete(b.held, id)
	}
	b.order = kept
}
