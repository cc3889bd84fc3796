package vtpm

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// hostile are descriptions a node with root could write into its
// measurement log.
var hostile = map[string]string{
	"ANSI escapes":         "initrd: \x1b[2J\x1b[1;1H\x1b]0;owned\x07enter-initrd\x1b[0m",
	"forged error line":    "initrd: enter-initrd\nPCR 4 was measured from: firmware: all good\r\nok",
	"1 MB":                 strings.Repeat("A", 1<<20),
	"bidi override":        "initrd: \u202eevil\u202c",
	"line separator":       "a\u2028b\u0085c",
	"invalid UTF-8":        "a\xff\xfeb",
	"NUL and DEL":          "a\x00b\x7fc",
	"C1 CSI":               "a\u009b31mb",
	"only control chars":   "\x1b\x1b\x1b",
	"replacement rune ok":  "a\uFFFDb",
	"many short multibyte": strings.Repeat("é", 10000),
}

func checkSafe(t *testing.T, s string, max int) {
	t.Helper()
	if !utf8.ValidString(s) {
		t.Errorf("%q is not valid UTF-8", s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			t.Errorf("%q keeps the non-printable rune %U", s, r)
		}
	}
	if len(s) > max {
		t.Errorf("%d bytes, want at most %d", len(s), max)
	}
}

func TestJoinDescriptionsDefusesHostileText(t *testing.T) {
	for name, d := range hostile {
		t.Run(name, func(t *testing.T) {
			out := joinDescriptions([]string{"firmware: EV_SEPARATOR", d}, maxPCRText)
			checkSafe(t, out, maxPCRText+len("; … (99 more)"))
			if !strings.HasPrefix(out, "firmware: EV_SEPARATOR") {
				t.Errorf("honest description lost: %q", out)
			}
		})
	}
}

func TestJoinDescriptionsBoundsTheTotal(t *testing.T) {
	ds := make([]string, 4096)
	for i := range ds {
		ds[i] = strings.Repeat("x", 1024)
	}
	out := joinDescriptions(ds, maxPCRText)
	checkSafe(t, out, maxPCRText+len("; … (4096 more)"))
	if !strings.Contains(out, "more)") {
		t.Errorf("does not say that descriptions were left out: %q", out)
	}
}

func TestPrintableKeepsHonestText(t *testing.T) {
	for _, s := range []string{"initrd: enter-initrd", "firmware: EV_EFI_BOOT_SERVICES_APPLICATION", "node lock: cluster ID ä"} {
		if got := printable(s, maxDescriptionRunes); got != s {
			t.Errorf("printable(%q) = %q", s, got)
		}
	}
}

func FuzzJoinDescriptions(f *testing.F) {
	for _, d := range hostile {
		if len(d) < 1<<12 {
			f.Add(d, "initrd: leave-initrd")
		}
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		out := joinDescriptions([]string{a, b, a}, maxPCRText)
		checkSafe(t, out, maxPCRText+len("; … (3 more)"))
		if strings.Contains(out, "\n") {
			t.Fatalf("newline in %q", out)
		}
	})
}
