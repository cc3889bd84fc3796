package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const greeting = `{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian"}, "capabilities": ["oob"]}}`

// fakeQEMU is the server end of a QMP connection, scripted by a test. It
// writes what a test tells it verbatim, so tests can send what QEMU never
// would.
type fakeQEMU struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

// socketPair returns the two ends of a connected Unix stream socket pair:
// the same kind of connection QEMU's QMP socket gives.
func socketPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), fmt.Sprintf("socketpair-%d", i))
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i] = c
	}
	return conns[0], conns[1]
}

func (s *fakeQEMU) send(format string, args ...any) {
	if _, err := fmt.Fprintf(s.conn, format+"\r\n", args...); err != nil {
		s.t.Errorf("fake QEMU: send: %v", err)
	}
}

// recv reads one request; ok is false once the client closed.
func (s *fakeQEMU) recv() (cmd string, id json.RawMessage, ok bool) {
	line, err := s.r.ReadBytes('\n')
	if err != nil {
		return "", nil, false
	}
	var req struct {
		Execute   string          `json:"execute"`
		Arguments json.RawMessage `json:"arguments"`
		ID        json.RawMessage `json:"id"`
	}
	if err := json.Unmarshal(line, &req); err != nil {
		s.t.Errorf("fake QEMU: request %q is not JSON: %v", line, err)
		return "", nil, false
	}
	return req.Execute, req.ID, true
}

// handshake plays QEMU's side of the handshake.
func (s *fakeQEMU) handshake() bool {
	s.send(greeting)
	cmd, id, ok := s.recv()
	if !ok || cmd != "qmp_capabilities" {
		s.t.Errorf("fake QEMU: first command = %q, want qmp_capabilities", cmd)
		return false
	}
	s.send(`{"return": {}, "id": %s}`, id)
	return true
}

// connect starts a fake QEMU running serve after the handshake and returns
// a client connected to it. The fake's goroutine has ended when the test's
// cleanup is done.
func connect(t *testing.T, serve func(s *fakeQEMU)) *Client {
	t.Helper()
	cc, sc := socketPair(t)
	s := &fakeQEMU{t: t, conn: sc, r: bufio.NewReader(sc)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if s.handshake() {
			serve(s)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := NewClient(ctx, cc)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() {
		c.Close()
		sc.Close()
		wg.Wait()
	})
	return c
}

// collectEvents reads Events until it is closed or a second passes.
func collectEvents(c *Client, n int) []string {
	var names []string
	timeout := time.After(time.Second)
	for len(names) < n {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				return names
			}
			names = append(names, ev.Name)
		case <-timeout:
			return names
		}
	}
	return names
}

// executeCases are TestExecute's cases.
var executeCases = map[string]struct {
	// reply answers the request with the given id.
	reply      func(s *fakeQEMU, id json.RawMessage)
	want       status
	wantClass  string // an *Error of this class
	wantClosed bool   // an error wrapping ErrClosed
	wantEvents []string
}{
	"return value": {
		reply: func(s *fakeQEMU, id json.RawMessage) {
			s.send(`{"return": {"status": "running", "singlestep": false, "running": true}, "id": %s}`, id)
		},
		want: status{Status: "running", Running: true},
	},
	"error reply": {
		reply: func(s *fakeQEMU, id json.RawMessage) {
			s.send(`{"error": {"class": "CommandNotFound", "desc": "The command query-status has not been found"}, "id": %s}`, id)
		},
		wantClass: "CommandNotFound",
	},
	"events around the reply": {
		reply: func(s *fakeQEMU, id json.RawMessage) {
			s.send(`{"timestamp": {"seconds": 1700000000, "microseconds": 5}, "event": "STOP"}`)
			// An event whose data looks like a reply is still an event.
			s.send(`{"event": "FAKE", "data": {"return": {"status": "wrong"}, "id": %s}}`, id)
			s.send(`{"return": {"status": "paused"}, "id": %s}`, id)
			s.send(`{"event": "RESUME"}`)
		},
		want:       status{Status: "paused"},
		wantEvents: []string{"STOP", "FAKE", "RESUME"},
	},
	"reply without id goes to the oldest command": {
		reply: func(s *fakeQEMU, id json.RawMessage) {
			s.send(`{"return": {"status": "prelaunch"}}`)
		},
		want: status{Status: "prelaunch"},
	},
	"reply for a command nobody waits for is dropped": {
		reply: func(s *fakeQEMU, id json.RawMessage) {
			s.send(`{"return": {"status": "wrong"}, "id": 999}`)
			s.send(`{"return": {"status": "running", "running": true}, "id": %s}`, id)
		},
		want: status{Status: "running", Running: true},
	},
	"malformed JSON": {
		reply: func(s *fakeQEMU, id json.RawMessage) {
			s.send(`{"return": {"status": `)
		},
		wantClosed: true,
	},
	"JSON that is not an object": {
		reply: func(s *fakeQEMU, id json.RawMessage) {
			s.send(`["return", %s]`, id)
		},
		wantClosed: true,
	},
	"unknown message": {
		reply: func(s *fakeQEMU, id json.RawMessage) {
			s.send(`{"hello": "world", "id": %s}`, id)
		},
		wantClosed: true,
	},
	"second greeting": {
		reply: func(s *fakeQEMU, id json.RawMessage) {
			s.send(greeting)
		},
		wantClosed: true,
	},
	"server closes mid command": {
		reply: func(s *fakeQEMU, id json.RawMessage) {
			s.send(`{"event": "SHUTDOWN", "data": {"guest": false, "reason": "host-qmp-quit"}}`)
			s.conn.Close()
		},
		wantClosed: true,
		wantEvents: []string{"SHUTDOWN"},
	},
}

func TestExecute(t *testing.T) {
	tests := executeCases
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := connect(t, func(s *fakeQEMU) {
				cmd, id, ok := s.recv()
				if !ok {
					return
				}
				if cmd != "query-status" {
					t.Errorf("command = %q, want query-status", cmd)
				}
				tc.reply(s, id)
				// Stay until the client is gone: closing is the case's
				// choice, not the fake's.
				for _, _, ok := s.recv(); ok; _, _, ok = s.recv() {
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var got status
			err := c.Execute(ctx, "query-status", nil, &got)
			var qerr *Error
			switch {
			case tc.wantClass != "":
				if !errors.As(err, &qerr) || qerr.Class != tc.wantClass {
					t.Fatalf("Execute() error = %v, want a QMP error of class %s", err, tc.wantClass)
				}
				if !strings.Contains(err.Error(), "has not been found") {
					t.Errorf("error %q lacks QEMU's description", err)
				}
			case tc.wantClosed:
				if !errors.Is(err, ErrClosed) {
					t.Fatalf("Execute() error = %v, want one wrapping ErrClosed", err)
				}
				// The connection is done for: later commands fail at once.
				if err := c.Execute(ctx, "query-status", nil, nil); !errors.Is(err, ErrClosed) {
					t.Fatalf("Execute() after the connection ended: error = %v, want one wrapping ErrClosed", err)
				}
			case err != nil:
				t.Fatalf("Execute() error = %v", err)
			case got != tc.want:
				t.Fatalf("Execute() result = %+v, want %+v", got, tc.want)
			}
			if got := collectEvents(c, len(tc.wantEvents)); strings.Join(got, ",") != strings.Join(tc.wantEvents, ",") {
				t.Errorf("events = %v, want %v", got, tc.wantEvents)
			}
		})
	}
}

func TestHandshake(t *testing.T) {
	tests := map[string]struct {
		serve   func(s *fakeQEMU)
		timeout time.Duration
		wantErr string // substring; empty for success
	}{
		"ok": {
			serve: func(s *fakeQEMU) { s.handshake() },
		},
		"garbage instead of a greeting": {
			serve:   func(s *fakeQEMU) { s.send("QEMU 7.2.22 monitor - type 'help' for more information") },
			wantErr: "malformed message",
		},
		"reply instead of a greeting": {
			serve:   func(s *fakeQEMU) { s.send(`{"return": {}}`) },
			wantErr: "not a QMP greeting",
		},
		"capabilities refused": {
			serve: func(s *fakeQEMU) {
				s.send(greeting)
				if _, id, ok := s.recv(); ok {
					s.send(`{"error": {"class": "CommandNotFound", "desc": "Capabilities negotiation is already complete, command ignored"}, "id": %s}`, id)
				}
			},
			wantErr: "CommandNotFound",
		},
		"closed before the greeting": {
			serve:   func(s *fakeQEMU) { s.conn.Close() },
			wantErr: "closed the connection",
		},
		"silent server": {
			serve:   func(s *fakeQEMU) {},
			timeout: 100 * time.Millisecond,
			wantErr: "deadline exceeded",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cc, sc := socketPair(t)
			s := &fakeQEMU{t: t, conn: sc, r: bufio.NewReader(sc)}
			done := make(chan struct{})
			go func() {
				defer close(done)
				tc.serve(s)
			}()
			defer func() { sc.Close(); <-done }()
			timeout := tc.timeout
			if timeout == 0 {
				timeout = 5 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			c, err := NewClient(ctx, cc)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("NewClient() error = %v", err)
				}
				if c.Version() != "7.2.22" {
					t.Errorf("Version() = %q, want 7.2.22", c.Version())
				}
				c.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("NewClient() error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestRepliesOutOfOrder checks that concurrent commands each get their own
// reply, whatever order QEMU answers them in.
func TestRepliesOutOfOrder(t *testing.T) {
	c := connect(t, func(s *fakeQEMU) {
		type req struct {
			cmd string
			id  json.RawMessage
		}
		var reqs []req
		for len(reqs) < 3 {
			cmd, id, ok := s.recv()
			if !ok {
				return
			}
			reqs = append(reqs, req{cmd, id})
		}
		for i := len(reqs) - 1; i >= 0; i-- {
			s.send(`{"return": {"status": %q}, "id": %s}`, reqs[i].cmd, reqs[i].id)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, cmd := range []string{"a", "b", "c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got status
			if err := c.Execute(ctx, cmd, nil, &got); err != nil {
				t.Errorf("Execute(%s) error = %v", cmd, err)
				return
			}
			if got.Status != cmd {
				t.Errorf("Execute(%s) got the reply to %s", cmd, got.Status)
			}
		}()
	}
	wg.Wait()
}

// TestGivingUp checks that a command whose context ends returns, and that
// its late reply is not taken for the reply to the next command.
func TestGivingUp(t *testing.T) {
	release := make(chan struct{})
	c := connect(t, func(s *fakeQEMU) {
		_, first, ok := s.recv()
		if !ok {
			return
		}
		<-release
		s.send(`{"return": {"status": "late"}, "id": %s}`, first)
		_, second, ok := s.recv()
		if !ok {
			return
		}
		s.send(`{"return": {"status": "running"}, "id": %s}`, second)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c.Execute(ctx, "query-status", nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Execute() error = %v, want the context's deadline", err)
	}
	close(release)
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	status, _, err := c.QueryStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if status != "running" {
		t.Fatalf("QueryStatus() = %q, want running (the late reply went to the wrong command)", status)
	}
}

// TestCloseFailsWaiting checks that Close wakes a waiting command and
// closes Events.
func TestCloseFailsWaiting(t *testing.T) {
	got := make(chan struct{})
	c := connect(t, func(s *fakeQEMU) {
		if _, _, ok := s.recv(); ok {
			close(got)
		}
		s.recv() // never answer; returns when the client closes
	})
	errc := make(chan error, 1)
	go func() { errc <- c.Execute(context.Background(), "query-status", nil, nil) }()
	<-got
	c.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("Execute() error = %v, want one wrapping ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Execute() still waits after Close")
	}
	if _, ok := <-c.Events(); ok {
		t.Fatal("Events delivered an event after Close")
	}
}

func TestCommands(t *testing.T) {
	tests := map[string]struct {
		run     func(c *Client, ctx context.Context) error
		wantCmd string
		// reply to the command; empty: close the connection instead.
		reply string
	}{
		"query-status": {
			run: func(c *Client, ctx context.Context) error {
				status, running, err := c.QueryStatus(ctx)
				if err == nil && (status != "running" || !running) {
					err = fmt.Errorf("QueryStatus() = %q, %v; want running, true", status, running)
				}
				return err
			},
			wantCmd: "query-status",
			reply:   `{"status": "running", "singlestep": false, "running": true}`,
		},
		"system_powerdown": {
			run:     (*Client).SystemPowerdown,
			wantCmd: "system_powerdown",
			reply:   `{}`,
		},
		"system_reset": {
			run:     (*Client).SystemReset,
			wantCmd: "system_reset",
			reply:   `{}`,
		},
		"quit with a reply": {
			run:     (*Client).Quit,
			wantCmd: "quit",
			reply:   `{}`,
		},
		"quit that closes before replying": {
			run:     (*Client).Quit,
			wantCmd: "quit",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := connect(t, func(s *fakeQEMU) {
				cmd, id, ok := s.recv()
				if !ok {
					return
				}
				if cmd != tc.wantCmd {
					t.Errorf("command = %q, want %q", cmd, tc.wantCmd)
				}
				if tc.reply == "" {
					s.conn.Close()
					return
				}
				s.send(`{"return": %s, "id": %s}`, tc.reply, id)
			})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tc.run(c, ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestArgumentsAreSent(t *testing.T) {
	gotArgs := make(chan string, 1)
	c := connect(t, func(s *fakeQEMU) {
		line, err := s.r.ReadBytes('\n')
		if err != nil {
			return
		}
		var req struct {
			Arguments json.RawMessage `json:"arguments"`
			ID        json.RawMessage `json:"id"`
		}
		if err := json.Unmarshal(line, &req); err != nil {
			t.Errorf("request is not JSON: %v", err)
			return
		}
		gotArgs <- string(req.Arguments)
		s.send(`{"return": {}, "id": %s}`, req.ID)
	})
	args := map[string]any{"device": "state", "size": 1 << 30}
	if err := c.Execute(context.Background(), "block_resize", args, nil); err != nil {
		t.Fatal(err)
	}
	if got, want := <-gotArgs, `{"device":"state","size":1073741824}`; got != want {
		t.Fatalf("arguments sent = %s, want %s", got, want)
	}
}
