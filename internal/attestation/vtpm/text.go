package vtpm

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on log text that reaches an error or a log line. The logs come
// from the node, and root on the node chooses every description in its
// measurement log: unbounded, a description could fill an operator's
// terminal, forge further error lines, or drive it with escape sequences.
const (
	// maxDescriptionRunes bounds one description.
	maxDescriptionRunes = 120
	// maxPCRText bounds what is said about one PCR.
	maxPCRText = 600
	// maxExplainText bounds what is said about all mismatched PCRs together.
	maxExplainText = 2048
)

// printable returns s with every rune that is not printable (control
// characters such as ESC and newline, format characters such as bidi
// overrides, invalid UTF-8) replaced by '?', cut to at most max runes.
// A replacement rather than a deletion leaves a visible sign that the log
// held something odd.
func printable(s string, max int) string {
	var b strings.Builder
	n := 0
	for i, r := range s {
		if n == max {
			b.WriteString("…")
			break
		}
		if (r == utf8.RuneError && isInvalidAt(s, i)) || !unicode.IsPrint(r) {
			r = '?'
		}
		b.WriteRune(r)
		n++
	}
	return b.String()
}

func isInvalidAt(s string, i int) bool {
	_, size := utf8.DecodeRuneInString(s[i:])
	return size <= 1
}

// joinDescriptions joins descriptions as printable text of at most max
// bytes (plus a short note of how many were left out).
func joinDescriptions(ds []string, max int) string {
	var b strings.Builder
	for i, d := range ds {
		sep := ""
		if i > 0 {
			sep = "; "
		}
		d = printable(d, maxDescriptionRunes)
		if b.Len()+len(sep)+len(d) > max {
			fmt.Fprintf(&b, "%s… (%d more)", sep, len(ds)-i)
			break
		}
		b.WriteString(sep)
		b.WriteString(d)
	}
	return b.String()
}
