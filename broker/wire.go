package broker

import (
	"net"
	"sync"
)

// corkLimit bounds what a corked connection holds before it writes anyway,
// so a window of large messages never piles up in memory.
const corkLimit = 256 << 10

// corkedConn is the socket under the AMQP connection. amqp091-go flushes
// its writer after every message: one write system call per publish,
// which is most of the CPU a publish costs. Between cork and flush the
// publisher gathers a window's frames into a few large writes instead.
// Whatever else the library writes meanwhile (a heartbeat) joins them in
// order, and outside a window every write goes straight through.
type corkedConn struct {
	net.Conn

	mu     sync.Mutex // held across the socket write, which keeps order
	corked bool
	buf    []byte
}

func (c *corkedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.corked {
		return c.Conn.Write(p)
	}
	c.buf = append(c.buf, p...)
	if len(c.buf) >= corkLimit {
		if err := c.writeBuffered(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// cork holds writes back until flush.
func (c *corkedConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// flush writes what cork held back and lets writes through again.
func (c *corkedConn) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	return c.writeBuffered()
}

func (c *corkedConn) writeBuffered() error {
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.buf)
	c.buf = c.buf[:0]
	return err
}
