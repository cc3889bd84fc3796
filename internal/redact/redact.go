// Package redact removes what looks like a secret from text that a node
// shows its owner: journal entries, kubeadm's output, support bundles.
package redact

import (
	"regexp"
	"strings"
)

// Redacted replaces what Secrets removes.
const Redacted = "[REDACTED]"

// secretPatterns match secrets that a node's programs are known to print,
// or could: no Orrery component logs a secret, but kubeadm prints the
// bootstrap tokens and certificate keys it makes, and a failing tool may
// echo a key file it read. Where a label says what follows, the label
// stays (group 1) and only the secret goes.
var secretPatterns = []struct {
	re   *regexp.Regexp
	with string
	// may is false only when re cannot match: most journal lines hold
	// no secret, and five regexps on each of them were most of a support
	// bundle's cost (BenchmarkSecrets).
	may func(string) bool
}{
	// PEM private keys of any kind, also cut off before their END line.
	{regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(-----END [A-Z0-9 ]*PRIVATE KEY-----|$)`), Redacted,
		func(s string) bool { return strings.Contains(s, "-----BEGIN ") }},
	// kubeadm bootstrap tokens: [a-z0-9]{6}.[a-z0-9]{16}.
	{regexp.MustCompile(`\b[a-z0-9]{6}\.[a-z0-9]{16}\b`), Redacted, mayHoldToken},
	// kubeadm's certificate key (--certificate-key, "certificate key:"),
	// which decrypts the control-plane certificates it uploads.
	{regexp.MustCompile(`(?i)(certificate[-_ ]key[:= ]+)[0-9a-f]{64}`), "${1}" + Redacted,
		func(s string) bool { return mayContainFold(s, "certificate") }},
	// A kubeconfig's inline private key, as a tool that prints one shows
	// it.
	{regexp.MustCompile(`(?i)((?:client-key|private-key)-data:\s*)\S+`), "${1}" + Redacted,
		func(s string) bool { return mayContainFold(s, "key-data") }},
	// Bearer tokens, as an HTTP client's debug output shows them.
	{regexp.MustCompile(`(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{16,}`), "${1}" + Redacted,
		func(s string) bool { return mayContainFold(s, "bearer") }},
}

// mayHoldToken reports whether s has a '.' with six of [a-z0-9] before it
// and sixteen after it, which every bootstrap token has.
func mayHoldToken(s string) bool {
	for i := 6; i+16 < len(s); i++ {
		if s[i] == '.' && tokenChars(s[i-6:i]) && tokenChars(s[i+1:i+17]) {
			return true
		}
	}
	return false
}

func tokenChars(s string) bool {
	for i := range len(s) {
		if c := s[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// mayContainFold reports whether s may hold lower (ASCII, lower case)
// in any case. Text with a byte outside ASCII may: (?i) also folds
// letters such as the Kelvin sign into ASCII ones.
func mayContainFold(s, lower string) bool {
	for i := range len(s) {
		if s[i] >= 0x80 {
			return true
		}
	}
	for i := 0; i+len(lower) <= len(s); i++ {
		j := 0
		for j < len(lower) && s[i+j]|0x20 == lower[j] {
			j++
		}
		if j == len(lower) {
			return true
		}
	}
	return false
}

// Secrets replaces anything in s that looks like a secret by Redacted.
func Secrets(s string) string {
	for _, p := range secretPatterns {
		if p.may(s) {
			s = p.re.ReplaceAllString(s, p.with)
		}
	}
	return s
}

var (
	beginKey = regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----`)
	endKey   = regexp.MustCompile(`-----END [A-Z0-9 ]*PRIVATE KEY-----`)
)

// Lines redacts text that comes a line at a time, such as a program's
// output: Secrets alone would see a private key's BEGIN line, and let the
// key's body through on the lines after it. The zero Lines is ready, for
// text read from its start; MidStream is one for text that may start
// inside a key.
type Lines struct {
	inKey bool
	// maybeInKey: the text may have started inside a key, and every line
	// so far looked like part of one.
	maybeInKey bool
}

// MidStream returns a Lines for text whose reader may have started
// anywhere, such as a window of a journal: its first lines are taken for
// a key's body while they look like one.
func MidStream() Lines {
	return Lines{maybeInKey: true}
}

// Line returns line, the next one, redacted. A line may hold several of
// the text's lines, as a journal entry does.
func (l *Lines) Line(line string) string {
	if l.maybeInKey {
		consumed, sep, rest, more := keyTail(line)
		l.maybeInKey = more
		switch {
		case more:
			return Redacted
		case consumed:
			return Redacted + sep + l.Line(rest)
		}
	}
	if l.inKey {
		end := endKey.FindStringIndex(line)
		if end == nil {
			return Redacted
		}
		l.inKey = false
		return Redacted + Secrets(line[end[1]:])
	}
	if begin := beginKey.FindStringIndex(line); begin != nil && endKey.FindStringIndex(line[begin[1]:]) == nil {
		l.inKey = true
	}
	return Secrets(line)
}

// keyTail reads the start of text as the rest of a key that began before
// the reader did: the lines that look like the key's body, up to and with
// its END line. It says whether it read any of text, what follows them
// (after sep: "" when rest is the END line's remainder, "\n" when rest is
// a line of its own), and whether all of text looked like the key's body.
func keyTail(text string) (consumed bool, sep, rest string, more bool) {
	for {
		ln, after, nl := strings.Cut(text, "\n")
		if end := endKey.FindStringIndex(ln); end != nil && beginKey.FindStringIndex(ln[:end[0]]) == nil {
			if nl {
				return true, "", ln[end[1]:] + "\n" + after, false
			}
			return true, "", ln[end[1]:], false
		}
		if !keyBody(ln) {
			return consumed, "\n", text, false
		}
		if !nl {
			return true, "", "", true
		}
		consumed, text = true, after
	}
}

// keyBody reports whether s could be one line of a PEM block's body:
// base64, wrapped at 64 (RFC 7468), with padding on the last. A short
// line counts only when it holds something besides letters, so that a
// window that starts on "Started" shows it.
func keyBody(s string) bool {
	s = strings.TrimRight(s, "\r")
	body := strings.TrimRight(s, "=")
	if body == "" || len(s) > 76 || len(s)-len(body) > 2 {
		return false
	}
	nonLetter := len(body) != len(s)
	for i := range len(body) {
		switch c := body[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9', c == '+', c == '/':
			nonLetter = true
		default:
			return false
		}
	}
	return nonLetter || len(s) >= 16
}

// maxWriters bounds the writers that Writers remembers.
const maxWriters = 4096

// Writers redacts the lines of many writers that reach one reader
// interleaved, as the processes' entries in a journal do: a key that one
// process prints a line at a time goes whole, whatever others print
// between its lines. The reader may start anywhere (MidStream). The zero
// Writers is ready.
type Writers struct {
	byWriter map[string]*Lines
}

// Line returns the next line of writer, redacted.
func (w *Writers) Line(writer, line string) string {
	l, ok := w.byWriter[writer]
	if !ok {
		if w.byWriter == nil {
			w.byWriter = make(map[string]*Lines)
		}
		if len(w.byWriter) >= maxWriters {
			w.forget()
		}
		ml := MidStream()
		l = &ml
		w.byWriter[writer] = l
	}
	return l.Line(line)
}

// forget drops the writers that are not inside a key, or all of them if
// that frees nothing: a writer met again starts MidStream, which takes
// the rest of a key's body for one.
func (w *Writers) forget() {
	for k, l := range w.byWriter {
		if !l.inKey {
			delete(w.byWriter, k)
		}
	}
	if len(w.byWriter) >= maxWriters {
		clear(w.byWriter)
	}
}
