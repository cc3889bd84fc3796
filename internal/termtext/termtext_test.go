package termtext

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestLine(t *testing.T) {
	for name, tc := range map[string]struct{ in, want string }{
		"plain":             {"kubelet started", "kubelet started"},
		"letters":           {"Grüße, 日本", "Grüße, 日本"},
		"fake second entry": {"ok\n2026-11-28T10:00:00.000000Z kubelet[1]: fine", `ok\n2026-11-28T10:00:00.000000Z kubelet[1]: fine`},
		"carriage return":   {"progress\roverwritten", `progress\roverwritten`},
		"tab":               {"a\tb", `a\tb`},
		"OSC 52 clipboard":  {"\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07", `\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07`},
		"erase line":        {"\x1b[2K\x1b[1Ahidden", `\x1b[2K\x1b[1Ahidden`},
		"8-bit CSI":         {"a\u009b2Kb", `a\u009b2Kb`},
		"DEL":               {"a\x7fb", `a\x7fb`},
		"not UTF-8":         {"a\xff\xfeb", `a\xff\xfeb`},
		"bidi override":     {"file\u202egnp.exe", `file\u202egnp.exe`},
		"zero width":        {"cp\u200b-0", `cp\u200b-0`},
		"line separator":    {"a\u2028b", `a\u2028b`},
	} {
		t.Run(name, func(t *testing.T) {
			if got := Line(tc.in); got != tc.want {
				t.Errorf("Line(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestLinesKeepsLineFeedsOnly(t *testing.T) {
	got := Lines("first\nsecond\x1b[2K\r")
	if want := "first\nsecond\\x1b[2K\\r"; got != want {
		t.Errorf("Lines = %q, want %q", got, want)
	}
}

func TestJSONStaysValid(t *testing.T) {
	in := map[string]string{"message": "a\x7f\u009b[2K\u202eb\x1b]52;c;x\x07"}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	safe := JSON(b)
	for _, r := range string(safe) {
		if r < 0x20 || r == 0x7f || Unsafe(r) {
			t.Fatalf("JSON left %U in %s", r, safe)
		}
	}
	var back map[string]string
	if err := json.Unmarshal(safe, &back); err != nil {
		t.Fatalf("escaped JSON does not parse: %v", err)
	}
	if back["message"] != in["message"] {
		t.Errorf("escaped JSON reads %q, want %q", back["message"], in["message"])
	}
}

// FuzzLine checks what the package promises of any input: one line, no
// control character or unsafe character left, and plain text unchanged.
func FuzzLine(f *testing.F) {
	for _, s := range []string{"plain", "a\nb", "\x1b]52;c;x\x07", "\xff", "\u202e", "ü\u0085"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := Line(s)
		if !utf8.ValidString(out) {
			t.Fatalf("Line(%q) = %q: not UTF-8", s, out)
		}
		for _, r := range out {
			if r < 0x20 || r == 0x7f || Unsafe(r) {
				t.Fatalf("Line(%q) = %q: it holds %U", s, out, r)
			}
		}
		if clean(s, false) && out != s {
			t.Fatalf("Line changed plain text %q to %q", s, out)
		}
		if strings.Count(Lines(s), "\n") != strings.Count(s, "\n") {
			t.Fatalf("Lines(%q) changed the number of lines", s)
		}
	})
}

func TestWriter(t *testing.T) {
	var out strings.Builder
	w := NewWriter(&out)
	// A character split between two writes stays whole; an escape
	// sequence, a carriage return and a C1 CSI do not reach the output.
	parts := []string{"NAME\tSTATE\n", "cp-0\tgr\xc3", "\xbcn\x1b]52;c;eA==\x07\r\n", "\u009b2K"}
	for _, p := range parts {
		n, err := w.Write([]byte(p))
		if err != nil || n != len(p) {
			t.Fatalf("Write(%q) = %d, %v", p, n, err)
		}
	}
	want := "NAME\tSTATE\ncp-0\tgrün\\x1b]52;c;eA==\\x07\\r\n\\u009b2K"
	if out.String() != want {
		t.Errorf("wrote %q, want %q", out.String(), want)
	}
}
