package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writePair writes a self-signed certificate for name and its key.
func writePair(t *testing.T, certFile, keyFile, name string, mod time.Time) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for path, block := range map[string]*pem.Block{certFile: {Type: "CERTIFICATE", Bytes: der}, keyFile: {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
}

// servedName is the name of the certificate r serves now.
func servedName(t *testing.T, r *certReloader) string {
	t.Helper()
	cert, err := r.GetCertificate(&tls.ClientHelloInfo{})
	if err != nil || cert == nil {
		t.Fatalf("GetCertificate = %v, %v", cert, err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.Subject.CommonName
}

// TestConsoleCertificateIsReloaded: the console serves a renewed
// certificate once its files change, without a restart, and keeps the
// last good one while the files are broken.
func TestConsoleCertificateIsReloaded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	at := time.Now().Add(-time.Hour).Truncate(time.Second)
	writePair(t, certFile, keyFile, "first.example.com", at)
	var told []error
	r, err := newCertReloader(certFile, keyFile, func(err error) { told = append(told, err) })
	if err != nil {
		t.Fatal(err)
	}
	if got := servedName(t, r); got != "first.example.com" {
		t.Fatalf("serves %s, want first.example.com", got)
	}
	writePair(t, certFile, keyFile, "renewed.example.com", at.Add(time.Minute))
	if got := servedName(t, r); got != "renewed.example.com" {
		t.Errorf("after renewal serves %s, want renewed.example.com", got)
	}
	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := servedName(t, r); got != "renewed.example.com" || len(told) != 1 {
		t.Errorf("with a broken key serves %s (%d errors told), want the last good one and the error told once", got, len(told))
	}
	servedName(t, r)
	if len(told) != 1 {
		t.Errorf("the same error was told %d times, want once", len(told))
	}
	if _, err := newCertReloader(filepath.Join(dir, "missing.crt"), keyFile, nil); err == nil {
		t.Error("a console whose certificate file is missing would start")
	}
}
