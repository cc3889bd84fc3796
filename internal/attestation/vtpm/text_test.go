package vtpm

import (
	"encoding/binary"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/google/go-eventlog/tcg"
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
			out := joinDescriptions([]string{"firmware: EV_SEPARATOR", d})
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
		ds[i] = strconv.Itoa(i) + strings.Repeat("x", 1024)
	}
	out := joinDescriptions(ds)
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
		out := joinDescriptions([]string{a, b, b, a})
		checkSafe(t, out, maxPCRText+len("; … (4 more)"))
		if strings.Contains(out, "\n") {
			t.Fatalf("newline in %q", out)
		}
	})
}

// utf16z is s as systemd-stub writes an event's description: UTF-16LE
// with a trailing NUL.
func utf16z(s string) []byte {
	var b []byte
	for _, u := range utf16.Encode([]rune(s + "\x00")) {
		b = binary.LittleEndian.AppendUint16(b, u)
	}
	return b
}

// An operator told that PCR 11 differs sees which UKI sections went into
// it, once each, not "firmware: IPL" eight times.
func TestMismatchNamesTheUKISections(t *testing.T) {
	var ds []string
	for _, section := range []string{".linux", ".osrel", ".cmdline", ".initrd"} {
		for range 2 { // the section's name, then its contents
			ds = append(ds, describeFirmwareEvent(tcg.Event{Type: tcg.Ipl, Data: utf16z(section)}))
		}
	}
	ds = append(ds, "initrd: enter-initrd", "initrd: leave-initrd")
	want := "firmware: IPL .linux (2×); firmware: IPL .osrel (2×); firmware: IPL .cmdline (2×); firmware: IPL .initrd (2×); initrd: enter-initrd; initrd: leave-initrd"
	if got := joinDescriptions(ds); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestUTF16TextRefusesWhatIsNotText(t *testing.T) {
	for name, data := range map[string][]byte{
		"empty":              nil,
		"odd length":         {'.', 0, 'l'},
		"NUL inside":         append(utf16z(".li"), utf16z("nux")...),
		"unpaired surrogate": {0x00, 0xd8, 'a', 0},
		"all NUL":            {0, 0, 0, 0},
	} {
		if got := utf16Text(data); got != "" {
			t.Errorf("%s: utf16Text(%x) = %q, want \"\"", name, data, got)
		}
	}
	if got := describeFirmwareEvent(tcg.Event{Type: tcg.Ipl, Data: []byte{1, 2, 3}}); got != "firmware: IPL" {
		t.Errorf("an IPL event with binary data is described as %q, want just its type", got)
	}
}

// Whatever a node writes as an IPL event's data, what reaches the
// operator is bounded, printable text.
func FuzzUTF16Text(f *testing.F) {
	f.Add(utf16z(".linux"))
	f.Add(utf16z("\x1b[2J\nPCR 4 was measured from: ok"))
	f.Add(utf16z(strings.Repeat("é", 500)))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := utf16Text(data)
		if strings.ContainsRune(s, 0) || strings.ContainsRune(s, utf8.RuneError) || !utf8.ValidString(s) {
			t.Fatalf("utf16Text(%x) = %q", data, s)
		}
		out := joinDescriptions([]string{describeFirmwareEvent(tcg.Event{Type: tcg.Ipl, Data: data}), "x"})
		checkSafe(t, out, maxPCRText+len("; … (2 more)"))
	})
}
