// Package journallog is a log/slog handler for journald. Each record is
// one journal entry: MESSAGE reads like a line of slog's text form (the
// console and 'journalctl -u' show it), and every attribute is also a
// field of its own, so that
//
//	journalctl -u bootstrapperd PHASE=kubeadm-init
//	journalctl -u bootstrapperd -o verbose
//
// find and show a phase, a peer or a cluster ID without parsing text.
// Outside systemd (tests, a daemon started by hand) New falls back to
// slog's text handler.
package journallog

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/coreos/go-systemd/v22/journal"
	"golang.org/x/sys/unix"
)

// SendFunc writes one journal entry (journal.Send).
type SendFunc func(message string, priority journal.Priority, fields map[string]string) error

// Options are a logger's settings beyond its identifier.
type Options struct {
	// Fallback receives slog text when journald does not run (tests, a
	// program started by hand), and records journald refused.
	Fallback io.Writer
	// Console, if set, receives each entry's MESSAGE too, as a line
	// "[uptime] identifier[pid]: MESSAGE" (journald's console form). A
	// node's serial console is read by whoever runs the host, so journald
	// forwards nothing there; a program whose log is written for that
	// reader (no secrets, and the only window into a node that has no
	// login) copies its own entries. Native journal entries never reach
	// a unit's StandardOutput=journal+console, hence this option.
	Console io.Writer
	// Level is the least level logged; nil means Info.
	Level slog.Leveler
}

// New returns a logger that writes to journald if it runs, and slog text
// to o.Fallback if not. identifier becomes SYSLOG_IDENTIFIER.
func New(identifier string, o Options) *slog.Logger {
	if !journal.Enabled() {
		return slog.New(slog.NewTextHandler(o.Fallback, &slog.HandlerOptions{Level: o.Level}))
	}
	h := NewHandler(identifier, journal.Send, o.Fallback)
	h.level = o.Level
	if o.Console != nil {
		h.console = &consoleWriter{w: o.Console, prefix: fmt.Sprintf("%s[%d]: ", identifier, os.Getpid()), now: uptime}
	}
	return slog.New(h)
}

// consoleWriter writes whole lines to the console, one writer at a time.
type consoleWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	now    func() time.Duration
}

func (c *consoleWriter) line(msg string) {
	t := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	// A console that fails must not fail the log: the journal has it.
	_, _ = fmt.Fprintf(c.w, "[%5d.%06d] %s%s\n", t/time.Second, (t%time.Second)/time.Microsecond, c.prefix, msg)
}

// uptime is CLOCK_MONOTONIC, the clock of the kernel's and journald's
// console timestamps.
func uptime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// Handler is the slog.Handler. Records it cannot send go to the fallback
// writer as text, so that nothing is lost if journald goes away.
type Handler struct {
	identifier string
	send       SendFunc
	fallback   io.Writer
	attrs      []slog.Attr // from WithAttrs, keys already qualified by groups
	group      string      // WithGroup prefix, "a.b."
	console    *consoleWriter
	level      slog.Leveler // nil: Info
}

// NewHandler returns a handler that sends through send.
func NewHandler(identifier string, send SendFunc, fallback io.Writer) *Handler {
	return &Handler{identifier: identifier, send: send, fallback: fallback}
}

// Enabled implements slog.Handler: the handler's level and above, Info
// unless set.
func (h *Handler) Enabled(_ context.Context, l slog.Level) bool {
	if h.level == nil {
		return l >= slog.LevelInfo
	}
	return l >= h.level.Level()
}

// WithAttrs implements slog.Handler.
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = slices.Clone(h.attrs)
	for _, a := range as {
		c.attrs = append(c.attrs, slog.Attr{Key: h.group + a.Key, Value: a.Value})
	}
	return &c
}

// WithGroup implements slog.Handler.
func (h *Handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.group = h.group + name + "."
	return &c
}

// Handle implements slog.Handler.
func (h *Handler) Handle(_ context.Context, r slog.Record) error {
	attrs := slices.Clone(h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		attrs = append(attrs, slog.Attr{Key: h.group + a.Key, Value: a.Value})
		return true
	})
	var flat []slog.Attr
	for _, a := range attrs {
		flat = flatten(flat, "", a)
	}

	var msg strings.Builder
	msg.WriteString(r.Message)
	fields := map[string]string{"SYSLOG_IDENTIFIER": h.identifier}
	for _, a := range flat {
		v := a.Value.String()
		fmt.Fprintf(&msg, " %s=%s", a.Key, quote(v))
		if name := FieldName(a.Key); name != "" {
			fields[name] = v
		}
	}
	if h.console != nil {
		h.console.line(msg.String())
	}
	if err := h.send(msg.String(), priority(r.Level), fields); err != nil {
		_, werr := fmt.Fprintf(h.fallback, "level=%s msg=%s (journald: %v)\n", r.Level, quote(msg.String()), err)
		return werr
	}
	return nil
}

// flatten expands group values into dotted keys.
func flatten(out []slog.Attr, prefix string, a slog.Attr) []slog.Attr {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return out
	}
	if a.Value.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, g := range a.Value.Group() {
			out = flatten(out, p, g)
		}
		return out
	}
	return append(out, slog.Attr{Key: prefix + a.Key, Value: a.Value})
}

func quote(s string) string {
	if s == "" || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == '"' || r == '=' || r > unicode.MaxASCII }) {
		return strconv.Quote(s)
	}
	return s
}

// FieldName turns an attribute key into a journal field name: clusterID
// becomes CLUSTER_ID, peer.addr PEER_ADDR. journald accepts A-Z, 0-9 and
// '_', not first a digit or '_' (those are its own trusted fields), at
// most 64 bytes; a key that cannot be made one gives "" (the attribute
// stays in MESSAGE only).
func FieldName(key string) string {
	var b strings.Builder
	var prev rune
	for _, r := range key {
		switch {
		case r >= 'A' && r <= 'Z':
			if prev >= 'a' && prev <= 'z' || prev >= '0' && prev <= '9' {
				b.WriteByte('_')
			}
			b.WriteRune(r)
		case r >= 'a' && r <= 'z':
			b.WriteRune(unicode.ToUpper(r))
		case r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
		prev = r
	}
	name := b.String()
	if name == "" || name[0] == '_' || name[0] >= '0' && name[0] <= '9' || len(name) > 64 {
		return ""
	}
	switch name {
	case "MESSAGE", "PRIORITY", "SYSLOG_IDENTIFIER", "CODE_FILE", "CODE_LINE", "CODE_FUNC", "MESSAGE_ID":
		// Fields journald and tools give a meaning of their own.
		return "ATTR_" + name
	}
	return name
}

func priority(l slog.Level) journal.Priority {
	switch {
	case l >= slog.LevelError:
		return journal.PriErr
	case l >= slog.LevelWarn:
		return journal.PriWarning
	case l >= slog.LevelInfo:
		return journal.PriInfo
	default:
		return journal.PriDebug
	}
}
