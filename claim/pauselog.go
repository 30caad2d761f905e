package claim

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
)

// newToken is a claim's token: random, so that a lease names one claim.
func newToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// pauseLog logs once when claiming pauses and once when it resumes, rather
// than on every tick of an outage.
type pauseLog struct{ paused bool }

func (p *pauseLog) log(logger *slog.Logger, why error) {
	if !p.paused {
		logger.Warn("claiming paused", "error", why)
		p.paused = true
	}
}

func (p *pauseLog) resume(logger *slog.Logger) {
	if p.paused {
		logger.Info("claiming resumed")
		p.paused = false
	}
}
