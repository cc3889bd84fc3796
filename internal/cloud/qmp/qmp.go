// Package qmp is a small client for the QEMU Machine Protocol (QMP), with
// which the local cloud asks a VM's QEMU for its status, resets it and
// powers it off.
//
// A Client reads QEMU's greeting, negotiates capabilities, and then runs
// commands with Execute. Replies are matched to their commands by "id", so
// commands may run concurrently; asynchronous events (SHUTDOWN, RESET, ...)
// arrive on the Events channel and are never taken for a reply. If the
// connection breaks or QEMU sends something that is not QMP, every waiting
// command fails with an error wrapping ErrClosed instead of waiting forever.
package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// ErrClosed is wrapped by the errors of commands that could not complete
// because the connection ended: QEMU exited, closed the socket, sent
// something that is not QMP, or Close was called.
var ErrClosed = errors.New("qmp connection closed")

// maxMessage bounds one message from QEMU. The largest replies we ask for
// (query-block, query-cpus-fast of a big VM) are a few hundred KiB.
const maxMessage = 16 << 20

// maxQueuedEvents bounds the events kept for a reader that does not read
// Events; beyond it the oldest are dropped, so a client nobody listens to
// cannot grow without bound.
const maxQueuedEvents = 4096

// Client is a QMP connection. Its methods are safe for concurrent use.
type Client struct {
	conn    net.Conn
	scanner *bufio.Scanner
	version string

	writeMu sync.Mutex

	mu      sync.Mutex
	nextID  uint64
	pending map[string]chan result // by the id's JSON text
	order   []string               // ids of pending commands in the order sent
	err     error                  // why the connection ended; nil while it works
	queue   []Event                // events not yet handed to Events
	wake    chan struct{}          // signals forwardEvents that queue or err changed

	events     chan Event
	readerDone chan struct{}
	userClosed chan struct{} // closed by Close: stop delivering events
	closeOnce  sync.Once
}

type result struct {
	ret json.RawMessage
	err error
}

type request struct {
	Execute   string          `json:"execute"`
	Arguments any             `json:"arguments,omitempty"`
	ID        json.RawMessage `json:"id"`
}

// Dial connects to the QMP socket at path (QEMU's -qmp unix:path,server=on)
// and completes the handshake.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("connect to QMP socket: %w", err)
	}
	return NewClient(ctx, conn)
}

// NewClient runs the QMP handshake on conn: it reads the greeting and
// enables the command mode with qmp_capabilities. ctx bounds the handshake
// only. The Client owns conn from now on, also when NewClient fails.
func NewClient(ctx context.Context, conn net.Conn) (*Client, error) {
	c := &Client{
		conn:       conn,
		scanner:    bufio.NewScanner(conn),
		pending:    map[string]chan result{},
		wake:       make(chan struct{}, 1),
		events:     make(chan Event),
		readerDone: make(chan struct{}),
		userClosed: make(chan struct{}),
	}
	c.scanner.Buffer(make([]byte, 0, 64<<10), maxMessage)

	// The greeting is read before the reader goroutine runs, so a deadline
	// from ctx is all it takes to bound it.
	interrupted := interruptOnDone(ctx, conn.SetReadDeadline)
	msg, err := c.readMessage()
	if interrupted() {
		err = fmt.Errorf("read QMP greeting: %w", ctx.Err())
	}
	if err == nil && msg.kind != kindGreeting {
		err = errors.New("the first message is not a QMP greeting; is this QEMU's QMP socket (not its monitor)?")
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("qmp handshake: %w", err)
	}
	c.version = msg.version

	go c.read()
	go c.forwardEvents()
	if err := c.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		c.Close()
		return nil, fmt.Errorf("qmp handshake: %w", err)
	}
	return c, nil
}

// Version is the QEMU version the greeting announced, e.g. "7.2.22".
func (c *Client) Version() string { return c.version }

// Events delivers QEMU's asynchronous events in the order they came. It is
// closed after the connection ends and the queued events were delivered (or
// right away by Close). Reading it is optional: unread events are queued, up
// to a bound beyond which the oldest are dropped.
func (c *Client) Events() <-chan Event { return c.events }

// Execute runs cmd with args (marshalled to JSON as its "arguments"; nil for
// none) and, if result is not nil, unmarshals QEMU's "return" value into it.
// An error reply is returned as an *Error (use errors.As); a broken
// connection as an error wrapping ErrClosed. If ctx ends first, Execute
// returns ctx's error and a late reply is discarded; QEMU may still run the
// command.
func (c *Client) Execute(ctx context.Context, cmd string, args any, result any) error {
	ret, err := c.execute(ctx, cmd, args)
	if err != nil {
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	if result == nil {
		return nil
	}
	if err := json.Unmarshal(ret, result); err != nil {
		return fmt.Errorf("qmp %s: decode reply %.200s: %w", cmd, ret, err)
	}
	return nil
}

func (c *Client) execute(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	c.mu.Lock()
	c.nextID++
	id := strconv.FormatUint(c.nextID, 10)
	c.mu.Unlock()
	line, err := json.Marshal(request{Execute: cmd, Arguments: args, ID: json.RawMessage(id)})
	if err != nil {
		return nil, fmt.Errorf("encode arguments: %w", err)
	}
	line = append(line, '\n')

	ch := make(chan result, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.pending[id] = ch
	c.order = append(c.order, id)
	c.mu.Unlock()

	if err := c.write(ctx, line); err != nil {
		c.forget(id)
		return nil, err
	}
	select {
	case r := <-ch:
		return r.ret, r.err
	case <-ctx.Done():
		c.forget(id)
		return nil, ctx.Err()
	}
}

func (c *Client) write(ctx context.Context, line []byte) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	// A peer that stops reading must not block the caller beyond ctx.
	interrupted := interruptOnDone(ctx, c.conn.SetWriteDeadline)
	_, err := c.conn.Write(line)
	if interrupted() && err == nil {
		return ctx.Err()
	}
	if err != nil {
		// A half-written command leaves the stream unusable.
		c.shutdown(fmt.Errorf("send command: %w", err))
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.err
	}
	return nil
}

// interruptOnDone makes a blocked read or write return when ctx ends, by
// setting a deadline in the past with set. The returned function must be
// called after the I/O: it clears the deadline and reports whether ctx
// interrupted.
func interruptOnDone(ctx context.Context, set func(time.Time) error) func() bool {
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = set(time.Unix(1, 0))
		close(done)
	})
	return func() bool {
		if stop() {
			return false
		}
		// The deadline may be set right now; clear it only afterwards.
		<-done
		_ = set(time.Time{})
		return true
	}
}

// forget drops a pending command whose caller gave up.
func (c *Client) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, id)
	c.dropFromOrder(id)
}

func (c *Client) dropFromOrder(id string) {
	for i, o := range c.order {
		if o == id {
			c.order = append(c.order[:i], c.order[i+1:]...)
			return
		}
	}
}

// read dispatches QEMU's messages until the connection ends.
func (c *Client) read() {
	defer close(c.readerDone)
	for {
		msg, err := c.readMessage()
		if err != nil {
			c.shutdown(err)
			return
		}
		switch msg.kind {
		case kindEvent:
			c.mu.Lock()
			if len(c.queue) == maxQueuedEvents {
				c.queue = c.queue[1:]
			}
			c.queue = append(c.queue, msg.event)
			c.mu.Unlock()
			c.signal()
		case kindReply:
			c.deliver(msg)
		case kindGreeting:
			c.shutdown(errors.New("unexpected second QMP greeting"))
			return
		}
	}
}

func (c *Client) readMessage() (message, error) {
	if !c.scanner.Scan() {
		if err := c.scanner.Err(); err != nil {
			return message{}, err
		}
		return message{}, errors.New("QEMU closed the connection")
	}
	msg, err := decodeMessage(c.scanner.Bytes())
	if err != nil {
		return message{}, fmt.Errorf("malformed message from QEMU (%.100q): %w", c.scanner.Bytes(), err)
	}
	return msg, nil
}

func (c *Client) deliver(msg message) {
	var r result
	if msg.err != nil {
		r.err = msg.err
	} else {
		r.ret = msg.ret
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	id := msg.id
	if id == "" {
		// QEMU leaves out the id only when it could not parse a request,
		// and it answers requests in order: the reply is the oldest's.
		if len(c.order) == 0 {
			return
		}
		id = c.order[0]
	}
	ch, ok := c.pending[id]
	if !ok {
		return // its caller gave up waiting
	}
	delete(c.pending, id)
	c.dropFromOrder(id)
	ch <- r
}

// shutdown ends the connection once, failing every waiting command with
// cause.
func (c *Client) shutdown(cause error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = fmt.Errorf("%w: %w", ErrClosed, cause)
		for id, ch := range c.pending {
			ch <- result{err: c.err}
			delete(c.pending, id)
		}
		c.order = nil
	}
	c.mu.Unlock()
	c.conn.Close()
	c.signal()
}

func (c *Client) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// forwardEvents hands queued events to the Events channel, so that the
// reader never waits for a slow event consumer (which could be waiting for
// a reply itself).
func (c *Client) forwardEvents() {
	defer close(c.events)
	for {
		c.mu.Lock()
		var ev Event
		have := len(c.queue) > 0
		if have {
			ev = c.queue[0]
			c.queue = c.queue[1:]
		}
		ended := c.err != nil
		c.mu.Unlock()
		switch {
		case have:
			select {
			case c.events <- ev:
			case <-c.userClosed:
				return
			}
		case ended:
			return
		default:
			<-c.wake
		}
	}
}

var errClosedByUser = errors.New("closed by the client")

// Close ends the connection. Waiting commands fail with an error wrapping
// ErrClosed; queued events are discarded and Events is closed.
func (c *Client) Close() error {
	c.closeOnce.Do(func() { close(c.userClosed) })
	c.shutdown(errClosedByUser)
	<-c.readerDone
	return nil
}

// status is the reply of query-status.
type status struct {
	Status  string `json:"status"`
	Running bool   `json:"running"`
}

// QueryStatus returns the VM's run state as QEMU names it ("running",
// "paused", "shutdown", "internal-error", ...) and whether its vCPUs run.
func (c *Client) QueryStatus(ctx context.Context) (string, bool, error) {
	var s status
	if err := c.Execute(ctx, "query-status", nil, &s); err != nil {
		return "", false, err
	}
	return s.Status, s.Running, nil
}

// SystemPowerdown presses the VM's ACPI power button. The guest decides
// whether and when to shut down; one without ACPI handling ignores it.
func (c *Client) SystemPowerdown(ctx context.Context) error {
	return c.Execute(ctx, "system_powerdown", nil, nil)
}

// SystemReset resets the VM, as the reset button of a real machine does.
func (c *Client) SystemReset(ctx context.Context) error {
	return c.Execute(ctx, "system_reset", nil, nil)
}

// Quit makes QEMU exit at once, like pulling the power plug. QEMU may close
// the connection before its reply is read; that counts as success.
func (c *Client) Quit(ctx context.Context) error {
	err := c.Execute(ctx, "quit", nil, nil)
	if errors.Is(err, ErrClosed) && !errors.Is(err, errClosedByUser) {
		return nil
	}
	return err
}
