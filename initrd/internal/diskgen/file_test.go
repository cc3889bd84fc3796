package diskgen

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/orrery-dev/orrery/internal/records/admitted"
)

func TestReadWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "var/lib/orrery/disk-generation")
	// A disk that never rejoined since generations exist holds none.
	if g, err := Read(path); g != 0 || err != nil {
		t.Fatalf("Read of no file = %d, %v; want 0", g, err)
	}
	for _, g := range []uint64{1, 42, admitted.MaxGeneration} {
		if err := Write(path, g); err != nil {
			t.Fatal(err)
		}
		if got, err := Read(path); got != g || err != nil {
			t.Fatalf("Read = %d, %v; want %d", got, err, g)
		}
	}
	raw, _ := os.ReadFile(path)
	if string(raw) != strconv.FormatUint(admitted.MaxGeneration, 10)+"\n" {
		t.Errorf("file holds %q", raw)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode %v, want 0600", fi.Mode().Perm())
	}
	for _, g := range []uint64{0, admitted.MaxGeneration + 1} {
		if err := Write(path, g); err == nil {
			t.Errorf("Write(%d) succeeded", g)
		}
	}
}

// Root on the node can write the file: what is not a generation is an
// error, never a number read some other way.
func TestParseRefuses(t *testing.T) {
	for name, in := range map[string]string{
		"empty":             "",
		"no newline":        "7",
		"zero":              "0\n",
		"leading zero":      "07\n",
		"sign":              "+7\n",
		"negative":          "-1\n",
		"space":             " 7\n",
		"two newlines":      "7\n\n",
		"CRLF":              "7\r\n",
		"hex":               "0x10\n",
		"past the bound":    strconv.FormatUint(admitted.MaxGeneration+1, 10) + "\n",
		"past uint64":       "18446744073709551616\n",
		"long":              strings.Repeat("9", 100) + "\n",
		"not digits":        "seven\n",
		"NUL":               "7\x00\n",
		"unicode digit":     "٧\n",
		"trailing garbage":  "7\nx",
		"newline only":      "\n",
		"over the size cap": strings.Repeat("1", maxFile+1),
	} {
		if g, err := Parse([]byte(in)); err == nil {
			t.Errorf("%s: Parse(%q) = %d, want an error", name, in, g)
		}
	}
	if _, err := Read(t.TempDir()); err == nil {
		t.Error("Read of a directory succeeded")
	}
}

// Root on the node can put anything at the file's place: what is not a
// regular file in a directory is refused, and nothing is followed or
// waited on.
func TestReadRefusesWhatIsNotAFile(t *testing.T) {
	dir := t.TempDir()
	elsewhere := filepath.Join(dir, "elsewhere")
	if err := os.WriteFile(elsewhere, []byte("7\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, plant := range map[string]func(path string) error{
		"symbolic link": func(path string) error { return os.Symlink(elsewhere, path) },
		"FIFO":          func(path string) error { return unix.Mkfifo(path, 0o600) },
		"directory":     func(path string) error { return os.Mkdir(path, 0o700) },
		"directory is a link": func(path string) error {
			os.Remove(filepath.Dir(path))
			return os.Symlink(dir, filepath.Dir(path))
		},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "orrery", "disk-generation")
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := plant(path); err != nil {
				t.Fatal(err)
			}
			if g, err := Read(path); err == nil {
				t.Fatalf("Read = %d, want an error", g)
			}
		})
	}
}

// FuzzParse: the file is the one thing on the disk the check reads, and
// root on the node may write anything there. Whatever Parse accepts is a
// generation a join service can have issued, written the way Write
// writes it.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := Parse(b)
		if err != nil {
			return
		}
		if g == 0 || g > admitted.MaxGeneration {
			t.Fatalf("Parse(%q) = %d", b, g)
		}
		if want := strconv.FormatUint(g, 10) + "\n"; string(b) != want {
			t.Fatalf("Parse(%q) = %d, which Write writes as %q", b, g, want)
		}
	})
}
