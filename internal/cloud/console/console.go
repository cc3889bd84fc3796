// Package console runs a shell command on a serial console: it types the
// command into the interactive shell on the line, as an operator would,
// and reads back exactly the command's output and exit status. The local
// cloud uses it on debug nodes, whose console logs root in by itself.
//
// The command's output is framed by marker lines that carry a random
// nonce, printed by printf so that the echo of the typed line never looks
// like a printed marker; whatever the line shows before the output
// (prompts, the echo, kernel messages) is ignored. Each line of output
// carries the nonce too, so that lines other programs write to the
// console meanwhile (our images forward the journal there) stay out of
// it: they come whole between the command's lines, as each program writes
// a line at once and the terminal does not mix writes. Only the kernel's
// own messages, which bypass the terminal, can still land inside a line.
package console

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Conn is a serial line: a QEMU console socket (net.Conn) or a terminal
// (*os.File). Run sets its deadline and clears it before returning.
type Conn interface {
	io.ReadWriter
	SetDeadline(t time.Time) error
}

// ErrNoShell means nothing answered like a shell on the line: the node is
// still booting, asks for a login (not a debug image), or another client
// holds the console.
var ErrNoShell = errors.New("no shell answered on the serial console")

// The words of the markers, printed as WORD-nonce.
const (
	readyWord = "ORRREADY"
	beginWord = "ORRBEGIN"
	lineWord  = "ORRLINE" // with a space after the nonce
	endWord   = "ORREND"
)

// env is the command's environment on top of the shell's: no pager, no
// colours and no hyperlinks in systemd's tools (or others that honour
// PAGER), and lines wide enough that systemctl does not cut them short.
const env = "SYSTEMD_PAGER=cat SYSTEMD_COLORS=0 SYSTEMD_URLIFY=0 PAGER=cat COLUMNS=200"

// probeEvery is how often Run asks the shell to answer until it does: what
// is typed while no one reads the line (the node still booting, getty
// restarting) is lost.
const probeEvery = 2 * time.Second

// maxLine is the longest line Run types: a terminal in canonical mode
// (a shell without line editing) holds 4095 bytes.
const maxLine = 4000

// Run types command into the shell on conn and returns its output (stdout
// and stderr together, without carriage returns) and its exit status. The
// command runs under sh -c, with stdin from /dev/null, stdout and stderr
// on a pipe (to sed, which prefixes each line), and an environment that
// keeps pagers and colours away, so "systemctl status x" and "journalctl
// -u x" print everything and return. The guest needs sed. The command
// must be printable ASCII on one line (use printf escapes for anything
// else): a serial line would take control characters as keys.
//
// Run waits until the shell answers, which on a booting node may take a
// while: call it early with a long deadline rather than watch for the
// prompt. When ctx ends before the shell answers, the error wraps
// ErrNoShell; when it ends while the command runs, Run sends Ctrl-C so
// that the shell is ready for the next caller, and returns what the
// command printed so far with the error.
// Without a deadline on ctx, a command that never ends blocks Run for
// good.
//
// A non-zero exit status is not an error; a command killed by a signal
// has status 128+signal (if the shell on the line is dash, its notice
// "Terminated" ends the output; bash keeps it out). With an error, the
// exit status is -1.
func Run(ctx context.Context, conn Conn, command string) (output string, exitCode int, err error) {
	nonce, err := newNonce()
	if err != nil {
		return "", -1, err
	}
	line, err := commandLine(command, nonce)
	if err != nil {
		return "", -1, err
	}
	r := &run{ctx: ctx, conn: conn, scan: newScanner(nonce), began: time.Now()}
	unwatch := r.watch()
	defer unwatch()

	if err := r.handshake(nonce); err != nil {
		return "", -1, err
	}
	if err := r.write(line); err != nil {
		return "", -1, err
	}
	if err := r.await(time.Time{}, r.scan.done); err != nil {
		if ctxEnded(err) {
			// After unwatch, ctx no longer touches the deadline that
			// lets Ctrl-C through.
			unwatch()
			r.interrupt()
		}
		return r.scan.output(), -1, r.unfinished(command, err)
	}
	return r.scan.output(), r.scan.code, nil
}

// commandLine is what Run types: the begin marker, then the command's
// output and the end marker with its exit status, each line prefixed by
// sed. printf's format, or quotes that the shell removes, join each word
// and the nonce only in what is printed, never in what is typed.
func commandLine(command, nonce string) (string, error) {
	if strings.TrimSpace(command) == "" {
		return "", errors.New("empty command")
	}
	for _, c := range []byte(command) {
		if c < 0x20 || c > 0x7e {
			return "", fmt.Errorf("command holds byte %q, which a serial line would take as a key or mangle: write it with printf escapes", c)
		}
	}
	quoted := "'" + strings.ReplaceAll(command, "'", `'\''`) + "'"
	line := fmt.Sprintf(`printf '%%s-%%s\n' %s %s; { %s sh -c %s </dev/null 2>&1; printf '%%s-%%s:%%s\n' %s %s "$?"; } | sed 's/^/%s-''%s /'`+"\n",
		beginWord, nonce, env, quoted, endWord, nonce, lineWord, nonce)
	if len(line) > maxLine {
		return "", fmt.Errorf("command too long for a terminal line (%d bytes typed, at most %d): put it in a script on the node", len(line), maxLine)
	}
	return line, nil
}

func newNonce() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("nonce: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// run is one Run on a line.
type run struct {
	ctx   context.Context
	conn  Conn
	scan  *scanner
	began time.Time
}

// watch makes a cancelled ctx interrupt a blocked read or write, as its
// deadline does; the returned function, which may be called again, stops
// that and clears the deadline.
func (r *run) watch() (stop func()) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-r.ctx.Done():
			r.conn.SetDeadline(time.Unix(1, 0))
		case <-done:
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			<-stopped
			r.conn.SetDeadline(time.Time{})
		})
	}
}

// handshake asks the shell, again every probeEvery, to print the ready
// marker, until it does. A probe appended to a half-typed line fails, but
// ends that line: the next one works. No Ctrl-C: on a booting node it
// would cut short the login shell's profile, or kill a shell that does
// not handle SIGINT yet.
func (r *run) handshake(nonce string) error {
	probe := fmt.Sprintf(`printf '%%s-%%s\n' %s %s`+"\n", readyWord, nonce)
	for {
		err := r.write(probe)
		if err == nil {
			err = r.await(time.Now().Add(probeEvery), r.scan.answered)
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, errPatience):
			continue
		case ctxEnded(err):
			seen := "the line stayed silent"
			if noise := r.scan.noise(200); noise != "" {
				seen = fmt.Sprintf("the line last showed %q", noise)
			}
			return fmt.Errorf("%w within %v (%w; %s): is this a debug image (make image DEBUG=1), with no other client on the console and no command still running there?",
				ErrNoShell, time.Since(r.began).Round(time.Millisecond), err, seen)
		default:
			return err
		}
	}
}

// errPatience ends an await at its own time limit, before ctx's.
var errPatience = errors.New("waited long enough")

// await reads the line into the scanner until cond holds, ctx ends, or
// until (unless zero) passes, which returns errPatience.
func (r *run) await(until time.Time, cond func() bool) error {
	buf := make([]byte, 32<<10)
	for !cond() {
		if err := r.setDeadline(until); err != nil {
			return err
		}
		n, err := r.conn.Read(buf)
		if ferr := r.scan.feed(buf[:n]); ferr != nil {
			return fmt.Errorf("garbled output on the serial line: %w", ferr)
		}
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			if cerr := r.ctxErr(); cerr != nil {
				return cerr
			}
			if !until.IsZero() && !time.Now().Before(until) {
				return errPatience
			}
		case errors.Is(err, io.EOF):
			return fmt.Errorf("the serial line closed (has the VM stopped?): %w", err)
		default:
			return fmt.Errorf("read the serial line: %w", err)
		}
	}
	return nil
}

// write types s, all of it, before ctx ends.
func (r *run) write(s string) error {
	if err := r.setDeadline(time.Time{}); err != nil {
		return err
	}
	if _, err := io.WriteString(r.conn, s); err != nil {
		if cerr := r.ctxErr(); cerr != nil {
			return fmt.Errorf("type on the serial line: %w", cerr)
		}
		return fmt.Errorf("type on the serial line: %w", err)
	}
	return nil
}

// setDeadline sets the line's deadline to the earlier of until (unless
// zero) and ctx's deadline. It checks ctx afterwards: had ctx ended
// before, watch's deadline might just have been overwritten.
func (r *run) setDeadline(until time.Time) error {
	if d, ok := r.ctx.Deadline(); ok && (until.IsZero() || d.Before(until)) {
		until = d
	}
	if err := r.conn.SetDeadline(until); err != nil {
		return fmt.Errorf("set a deadline on the serial line: %w", err)
	}
	return r.ctxErr()
}

// ctxErr is ctx's error, also when its deadline has passed but its timer
// has not fired yet (the line's deadline may fire first).
func (r *run) ctxErr() error {
	if err := r.ctx.Err(); err != nil {
		return err
	}
	if d, ok := r.ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// interrupt sends Ctrl-C, with a moment of its own after ctx has ended,
// so that the next caller finds the shell at its prompt rather than behind
// a hung command.
func (r *run) interrupt() {
	if r.conn.SetDeadline(time.Now().Add(time.Second)) == nil {
		_, _ = io.WriteString(r.conn, "\x03")
	}
	r.conn.SetDeadline(time.Time{})
}

// unfinished explains why the command's output did not complete.
func (r *run) unfinished(command string, err error) error {
	if !ctxEnded(err) {
		return err
	}
	took := time.Since(r.began).Round(time.Millisecond)
	if !r.scan.started() {
		return fmt.Errorf("the shell did not start %q within %v (it was sent Ctrl-C): %w", command, took, err)
	}
	return fmt.Errorf("command %q did not finish within %v (it was sent Ctrl-C): %w", command, took, err)
}

func ctxEnded(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}
