// Package termtext makes text that a node or the API server supplied safe
// to print on the owner's terminal. Root on a node chooses its journal's
// messages, its units' descriptions and the errors its services return; a
// worker's kubelet chooses parts of its Node. Printed raw, such text can
// drive the terminal (OSC 52 writes the clipboard, CSI sequences erase
// lines and move the cursor, bidirectional overrides reorder what is
// shown) or start a line that looks like the owner's tool's own output.
// Every such string goes through Line (one record, one line) or Lines (an
// error of the CLI's own, whose line breaks are meant) before it is
// printed.
package termtext

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Line returns s with every character that is not plain printable text
// written as a Go-style escape: \n, \r and \t, \xNN for other control
// bytes and for bytes that are not UTF-8, \uNNNN for C1 controls and the
// characters that change the direction or visibility of text. What
// remains prints as itself on one line. Printable text, including
// non-ASCII letters, is unchanged.
func Line(s string) string {
	if clean(s, false) {
		return s
	}
	return escape(s, false)
}

// Lines is Line that keeps line feeds: for multi-line text the CLI
// composed itself (an error that joins several), which may carry a
// node's words.
func Lines(s string) string {
	if clean(s, true) {
		return s
	}
	return escape(s, true)
}

func clean(s string, keepNewline bool) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= utf8.RuneSelf || c < 0x20 || c == 0x7f {
			if c == '\n' && keepNewline {
				continue
			}
			return false
		}
	}
	return true
}

func escape(s string, keepNewline bool) string {
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n' && keepNewline:
			b.WriteByte('\n')
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case Unsafe(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// Unsafe reports whether r, a character beyond ASCII, must not reach a
// terminal as itself: a C1 control (U+0080 to U+009F; U+009B is CSI on
// terminals that read 8-bit controls), a character that reorders text
// (bidirectional embeddings, overrides and isolates) or hides it
// (zero-width characters, the byte order mark), or a line or paragraph
// separator.
func Unsafe(r rune) bool {
	switch {
	case r >= 0x80 && r <= 0x9f:
		return true
	case r >= 0x200b && r <= 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	case r == 0x2028 || r == 0x2029 || r == 0xfeff || r == 0x061c:
		return true
	}
	return false
}

// JSON rewrites the characters of encoded JSON that encoding/json leaves
// as they are (DEL and those Unsafe names) as \u escapes, which mean the
// same to a JSON reader. encoding/json already escapes the C0 controls
// and replaces bytes that are not UTF-8, so what remains prints safely.
func JSON(b []byte) []byte {
	safe := true
	for _, r := range string(b) {
		if r == 0x7f || Unsafe(r) {
			safe = false
			break
		}
	}
	if safe {
		return b
	}
	var out strings.Builder
	for _, r := range string(b) {
		if r == 0x7f || Unsafe(r) {
			fmt.Fprintf(&out, `\u%04x`, r)
			continue
		}
		out.WriteRune(r)
	}
	return []byte(out.String())
}

// Writer passes text to a terminal with every control character escaped
// as Lines does, but tabs kept too: the CLI's own output is lines and
// tab-aligned columns and never drives the terminal, so whatever of a
// node's that reached an output unescaped still cannot. A character that
// a Write splits is held until the next Write completes it.
type Writer struct {
	w       io.Writer
	pending []byte
}

// NewWriter returns a Writer onto w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write writes p, escaped, and reports p as written in full when the
// escaped text was.
func (w *Writer) Write(p []byte) (int, error) {
	buf := append(w.pending, p...)
	w.pending = nil
	// Hold back a character cut at the end of p, at most 3 bytes.
	if cut := incompleteTail(buf); cut > 0 {
		w.pending = append([]byte(nil), buf[len(buf)-cut:]...)
		buf = buf[:len(buf)-cut]
	}
	s := string(buf)
	if !cleanKeeping(s) {
		s = escapeKeeping(s)
	}
	if _, err := io.WriteString(w.w, s); err != nil {
		return 0, err
	}
	return len(p), nil
}

// incompleteTail is how many bytes at the end of b start a UTF-8
// character that b does not finish.
func incompleteTail(b []byte) int {
	for n := 1; n <= 3 && n <= len(b); n++ {
		c := b[len(b)-n]
		if c < 0x80 {
			return 0
		}
		if c >= 0xc0 { // a leading byte: is its character complete?
			if utf8.FullRune(b[len(b)-n:]) {
				return 0
			}
			return n
		}
	}
	return 0
}

func cleanKeeping(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= utf8.RuneSelf || (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

func escapeKeeping(s string) string {
	var b strings.Builder
	for _, part := range strings.SplitAfter(s, "\t") {
		tab := strings.HasSuffix(part, "\t")
		b.WriteString(escape(strings.TrimSuffix(part, "\t"), true))
		if tab {
			b.WriteByte('\t')
		}
	}
	return b.String()
}

// Error returns err with its message on one line, escaped as Line does,
// for an error whose text a node chose (a gRPC status it returned).
// errors.Is and errors.As still see err.
func Error(err error) error {
	if err == nil {
		return nil
	}
	return lineError{err}
}

type lineError struct{ err error }

func (e lineError) Error() string { return Line(e.err.Error()) }
func (e lineError) Unwrap() error { return e.err }
