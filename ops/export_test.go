package ops

import (
	"net/http"
	"time"
)

// Handler serves the endpoints of the main address, for requests sent
// without a listener (httptest), from any client address.
func (s *Server) Handler() http.Handler { return s.main.srv.Handler }

// Timeouts returns the main server's read-header, read, write and idle
// timeouts.
func (s *Server) Timeouts() (readHeader, read, write, idle time.Duration) {
	srv := s.main.srv
	return srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout
}
