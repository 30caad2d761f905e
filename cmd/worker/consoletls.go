package main

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"
)

// certReloader serves the console's TLS certificate from its files and
// reads them again when either changes (a renewal by cert-manager or
// certbot), without a restart: each handshake compares the files'
// modification times and sizes with those last read. A pair that cannot
// be read, or does not match, keeps the last good one.
type certReloader struct {
	certFile, keyFile string
	onError           func(error)

	mu      sync.Mutex
	cert    *tls.Certificate
	seen    [2]fileStamp
	lastErr string // the last error told, so that each is told once
}

// fileStamp is what tells a file changed.
type fileStamp struct {
	mod  time.Time
	size int64
}

func stampOf(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{mod: fi.ModTime(), size: fi.Size()}, nil
}

// newCertReloader reads the pair once: a console whose certificate
// cannot be read does not start.
func newCertReloader(certFile, keyFile string, onError func(error)) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, onError: onError}
	if err := r.reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// reload reads the pair when its files changed since last read.
func (r *certReloader) reload() error {
	cs, err := stampOf(r.certFile)
	if err != nil {
		return fmt.Errorf("OUTBOX_CONSOLE_TLS_CERT: %w", err)
	}
	ks, err := stampOf(r.keyFile)
	if err != nil {
		return fmt.Errorf("OUTBOX_CONSOLE_TLS_KEY: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cert != nil && r.seen == [2]fileStamp{cs, ks} {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("OUTBOX_CONSOLE_TLS_CERT and OUTBOX_CONSOLE_TLS_KEY: %w", err)
	}
	r.cert, r.seen = &cert, [2]fileStamp{cs, ks}
	return nil
}

// GetCertificate is tls.Config.GetCertificate.
func (r *certReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	err := r.reload()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil && err.Error() != r.lastErr && r.onError != nil {
		r.onError(err)
	}
	r.lastErr = errText(err)
	return r.cert, nil
}

// tlsConfig is the console's TLS configuration: TLS 1.2 at least, the
// certificate from r.
func (r *certReloader) tlsConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.GetCertificate}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
