package testenv

import (
	"net"
	"sync"
	"testing"
)

// Serve starts a TCP server on 127.0.0.1 (a free port) that calls handle,
// in a goroutine of its own, with each connection it accepts, and returns
// its address: a stand-in server, or a proxy that rewrites what passes.
// At t.Cleanup it stops accepting, closes every accepted connection and
// waits for every handle to return; a handle that holds other connections
// must close them once its own fails.
func Serve(t testing.TB, handle func(net.Conn)) string {
	t.Helper()
	ln, err := new(net.ListenConfig).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: listen: %v", err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { handle(c) })
		}
	})
	return ln.Addr().String()
}
