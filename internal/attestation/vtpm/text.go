package vtpm

import (
	"encoding/binary"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf16"
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

// joinDescriptions joins descriptions as printable text of at most
// maxPCRText bytes (plus a short note of how many were left out). A description
// repeated in a row is said once with its count: systemd-stub logs each
// UKI section twice (its name, then its contents).
func joinDescriptions(ds []string) string {
	const max = maxPCRText
	var b strings.Builder
	for i := 0; i < len(ds); {
		n := 1
		for i+n < len(ds) && ds[i+n] == ds[i] {
			n++
		}
		sep := ""
		if i > 0 {
			sep = "; "
		}
		d := printable(ds[i], maxDescriptionRunes)
		if n > 1 {
			d = fmt.Sprintf("%s (%d×)", d, n)
		}
		if b.Len()+len(sep)+len(d) > max {
			fmt.Fprintf(&b, "%s… (%d more)", sep, len(ds)-i)
			break
		}
		b.WriteString(sep)
		b.WriteString(d)
		i += n
	}
	return b.String()
}

// utf16Text reads event data that firmware and systemd-stub write as
// UTF-16LE text with a trailing NUL. It gives "" for data that is not
// such text; what it gives is still the node's and must go through
// printable before anyone sees it.
func utf16Text(data []byte) string {
	if len(data) < 2 || len(data)%2 != 0 {
		return ""
	}
	// Enough for one description; the rest would be cut anyway.
	if limit := 2 * (maxDescriptionRunes + 1); len(data) > limit {
		data = data[:limit]
	}
	units := make([]uint16, len(data)/2)
	for i := range units {
		units[i] = binary.LittleEndian.Uint16(data[2*i:])
	}
	for len(units) > 0 && units[len(units)-1] == 0 {
		units = units[:len(units)-1]
	}
	s := string(utf16.Decode(units))
	for _, r := range s {
		if r == utf8.RuneError || r == 0 {
			return ""
		}
	}
	return s
}
