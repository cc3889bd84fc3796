package keys

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

func TestMasterSecretFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "orrery-master-secret.json")
	ms := testSecret()

	if err := WriteMasterSecretFile(path, ms); err != nil {
		t.Fatalf("WriteMasterSecretFile() error = %v", err)
	}
	got, err := ReadMasterSecretFile(path)
	if err != nil {
		t.Fatalf("ReadMasterSecretFile() error = %v", err)
	}
	if !bytes.Equal(got.Key, ms.Key) || !bytes.Equal(got.Salt, ms.Salt) {
		t.Errorf("read back a different secret")
	}

	if runtime.GOOS != "windows" {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm != 0o600 {
			t.Errorf("file mode = %04o, want 0600", perm)
		}
	}
	assertOnlyFile(t, dir, "orrery-master-secret.json")
}

func TestMasterSecretFileFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secret.json")
	if err := WriteMasterSecretFile(path, testSecret()); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The file format is a contract with older and newer CLIs.
	want := `{
  "key": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
  "salt": "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8="
}
`
	if string(data) != want {
		t.Errorf("file content:\n%s\nwant:\n%s", data, want)
	}
}

func TestWriteMasterSecretFileRefusesOverwrite(t *testing.T) {
	testCases := map[string]struct {
		// link replaces the hard-link step; nil keeps os.Link.
		link func(oldname, newname string) error
	}{
		"hard link": {},
		"filesystem without hard links": {
			link: func(oldname, newname string) error {
				return &os.LinkError{Op: "link", Old: oldname, New: newname, Err: syscall.EPERM}
			},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			if tc.link != nil {
				linkFile = tc.link
				t.Cleanup(func() { linkFile = os.Link })
			}
			dir := t.TempDir()
			path := filepath.Join(dir, "secret.json")
			if err := WriteMasterSecretFile(path, testSecret()); err != nil {
				t.Fatalf("first write: %v", err)
			}
			other := MasterSecret{Key: seq(0x80, 0xa0), Salt: seq(0xa0, 0xc0)}
			err := WriteMasterSecretFile(path, other)
			if !errors.Is(err, fs.ErrExist) {
				t.Fatalf("second write error = %v, want fs.ErrExist", err)
			}
			if !strings.Contains(err.Error(), "lose the keys") || !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the file and the risk", err)
			}
			got, err := ReadMasterSecretFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Key, testSecret().Key) {
				t.Error("the existing secret was replaced")
			}
			assertOnlyFile(t, dir, "secret.json")
		})
	}
}

// TestWriteMasterSecretFileRace covers a file that appears between the
// existence check and the hard link.
func TestWriteMasterSecretFileRace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "secret.json")
	linkFile = func(oldname, newname string) error {
		if err := os.WriteFile(newname, []byte("someone else's"), 0o600); err != nil {
			return err
		}
		return os.Link(oldname, newname)
	}
	t.Cleanup(func() { linkFile = os.Link })

	err := WriteMasterSecretFile(path, testSecret())
	if !errors.Is(err, fs.ErrExist) {
		t.Fatalf("error = %v, want fs.ErrExist", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != "someone else's" {
		t.Errorf("file was replaced: %q", data)
	}
	assertOnlyFile(t, dir, "secret.json")
}

func TestWriteMasterSecretFileErrors(t *testing.T) {
	testCases := map[string]struct {
		path    func(dir string) string
		ms      MasterSecret
		wantErr string
	}{
		"short key": {
			path:    func(dir string) string { return filepath.Join(dir, "secret.json") },
			ms:      MasterSecret{Key: seq(0, 16), Salt: seq(0, 32)},
			wantErr: "master key has 16 bytes, want 32",
		},
		"missing salt": {
			path:    func(dir string) string { return filepath.Join(dir, "secret.json") },
			ms:      MasterSecret{Key: seq(0, 32)},
			wantErr: "master salt has 0 bytes, want 32",
		},
		"missing directory": {
			path:    func(dir string) string { return filepath.Join(dir, "nope", "secret.json") },
			ms:      testSecret(),
			wantErr: "no such file or directory",
		},
		"path is a directory": {
			path:    func(dir string) string { return dir },
			ms:      testSecret(),
			wantErr: "already exists",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			err := WriteMasterSecretFile(tc.path(dir), tc.ms)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("WriteMasterSecretFile() error = %v, want one containing %q", err, tc.wantErr)
			}
			assertOnlyFile(t, dir, "")
		})
	}
}

const validMasterSecretJSON = `{"key":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=","salt":"ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8="}`

var readMasterSecretFileCases = map[string]struct {
	content string
	mode    os.FileMode
	unix    bool // the case relies on Unix permission bits
	wantErr string
}{
	"valid": {content: validMasterSecretJSON, mode: 0o600},
	"valid, read-only": {
		content: validMasterSecretJSON, mode: 0o400,
	},
	"valid, surrounding whitespace": {
		content: "\n  " + validMasterSecretJSON + "\n\n", mode: 0o600,
	},
	"empty": {
		content: "", mode: 0o600, wantErr: "file is empty",
	},
	"only whitespace": {
		content: " \n\t", mode: 0o600, wantErr: "file is empty",
	},
	"truncated": {
		content: validMasterSecretJSON[:len(validMasterSecretJSON)/2], mode: 0o600, wantErr: "truncated or corrupted",
	},
	"garbage": {
		content: "\x00\x01binary\xff", mode: 0o600, wantErr: "truncated or corrupted",
	},
	"JSON array": {
		content: "[1,2]", mode: 0o600, wantErr: "truncated or corrupted",
	},
	"JSON null": {
		content: "null", mode: 0o600, wantErr: "master key has 0 bytes",
	},
	"unknown field": {
		content: `{"key":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=","salt":"ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=","pepper":"x"}`,
		mode:    0o600, wantErr: `unknown field "pepper"`,
	},
	"trailing data": {
		content: validMasterSecretJSON + validMasterSecretJSON, mode: 0o600, wantErr: "unexpected data after the JSON object",
	},
	"bad base64": {
		content: `{"key":"!!!","salt":"ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8="}`,
		mode:    0o600, wantErr: "illegal base64",
	},
	"short key": {
		content: `{"key":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHg==","salt":"ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8="}`,
		mode:    0o600, wantErr: "master key has 31 bytes, want 32",
	},
	"long salt": {
		content: `{"key":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=","salt":"ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj9A"}`,
		mode:    0o600, wantErr: "master salt has 33 bytes, want 32",
	},
	"missing salt": {
		content: `{"key":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="}`,
		mode:    0o600, wantErr: "master salt has 0 bytes, want 32",
	},
	"group readable": {
		content: validMasterSecretJSON, mode: 0o640, unix: true,
		wantErr: "is readable by others (mode 0640): chmod 600 it",
	},
	"world readable": {
		content: validMasterSecretJSON, mode: 0o644, unix: true,
		wantErr: "is readable by others (mode 0644): chmod 600 it",
	},
	"group writable": {
		content: validMasterSecretJSON, mode: 0o620, unix: true,
		wantErr: "is accessible by others (mode 0620): chmod 600 it",
	},
	"too large": {
		content: validMasterSecretJSON + strings.Repeat(" ", maxFileSize), mode: 0o600,
		wantErr: "is larger than",
	},
}

func TestReadMasterSecretFile(t *testing.T) {
	for name, tc := range readMasterSecretFileCases {
		t.Run(name, func(t *testing.T) {
			if tc.unix && runtime.GOOS == "windows" {
				t.Skip("needs Unix permission bits")
			}
			path := filepath.Join(t.TempDir(), "secret.json")
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			// Chmod after writing, because the umask may strip bits
			// from WriteFile's mode.
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatal(err)
			}
			ms, err := ReadMasterSecretFile(path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ReadMasterSecretFile() error = %v, want one containing %q", err, tc.wantErr)
				}
				if !strings.Contains(err.Error(), path) {
					t.Errorf("error %q does not name the file", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ReadMasterSecretFile() error = %v", err)
			}
			if !bytes.Equal(ms.Key, seq(0x00, 0x20)) || !bytes.Equal(ms.Salt, seq(0x20, 0x40)) {
				t.Errorf("ReadMasterSecretFile() = %x/%x, want the test secret", ms.Key, ms.Salt)
			}
		})
	}
}

func TestReadMasterSecretFileNotRegular(t *testing.T) {
	testCases := map[string]struct {
		path    func(dir string) string
		wantErr string
	}{
		"missing": {
			path:    func(dir string) string { return filepath.Join(dir, "nope.json") },
			wantErr: "no such file or directory",
		},
		"directory": {
			path:    func(dir string) string { return dir },
			wantErr: "is not a regular file",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			path := tc.path(t.TempDir())
			_, err := ReadMasterSecretFile(path)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), path) {
				t.Fatalf("ReadMasterSecretFile() error = %v, want one naming %s and containing %q", err, path, tc.wantErr)
			}
		})
	}
}

// assertOnlyFile fails if dir holds anything but the named file (or
// nothing, if name is empty): a leftover temporary file would be a second
// copy of the secret.
func assertOnlyFile(t *testing.T, dir, name string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{}
	if name != "" {
		want = []string{name}
	}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Errorf("directory holds %q, want %q", names, want)
	}
}
