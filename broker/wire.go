package broker

import (
	"net"
	"sync"
	"time"
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
//
// Every socket write has a deadline: the library writes with its own locks
// held and no timeout, so a broker that stops reading would otherwise
// hang the publisher, the heartbeater and every close behind them.
type corkedConn struct {
	net.Conn
	timeout time.Duration // each socket write's deadline; 0: none

	mu     sync.Mutex // held across the socket write, which keeps order
	corked bool
	buf    []byte
	err    error // the first failed socket write: the stream is broken after it
}

func (c *corkedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if !c.corked {
		return c.write(p)
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

// flush writes what cork held back and lets writes through again. It
// returns the error of any socket write since cork, even one the library
// saw first and swallowed.
func (c *corkedConn) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	if c.err != nil {
		return c.err
	}
	return c.writeBuffered()
}

// abort closes the socket at once, without the lock: a write blocked on a
// broker that stopped reading fails now rather than at its deadline, and
// so does everything queued behind it.
func (c *corkedConn) abort() {
	_ = c.Conn.Close()
}

func (c *corkedConn) writeBuffered() error {
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.write(c.buf)
	c.buf = c.buf[:0]
	return err
}

func (c *corkedConn) write(p []byte) (int, error) {
	if c.timeout > 0 {
		if err := c.Conn.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
			c.err = err
			return 0, err
		}
	}
	n, err := c.Conn.Write(p)
	if err != nil {
		// Part of a frame may have left: nothing written after it could be
		// parsed, so the connection is done.
		c.err = err
	}
	return n, err
}
