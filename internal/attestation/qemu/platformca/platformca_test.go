package platformca

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSaveLoad(t *testing.T) {
	dir := t.TempDir()
	ca, err := New("test")
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %o, want 600", st.Mode().Perm())
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Cert.Equal(ca.Cert) || !got.key.Equal(ca.key) {
		t.Fatal("loaded CA differs from the saved one")
	}
}

func TestLoadRejects(t *testing.T) {
	a, _ := New("a")
	b, _ := New("b")
	dirA, dirB := t.TempDir(), t.TempDir()
	if err := a.Save(dirA); err != nil {
		t.Fatal(err)
	}
	if err := b.Save(dirB); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		setup   func(dir string)
		wantErr string
	}{
		"key of another CA": {func(dir string) {
			copyFile(t, filepath.Join(dirA, CertFile), filepath.Join(dir, CertFile))
			copyFile(t, filepath.Join(dirB, KeyFile), filepath.Join(dir, KeyFile))
		}, "does not hold the key"},
		"garbage certificate": {func(dir string) {
			os.WriteFile(filepath.Join(dir, CertFile), []byte("not pem"), 0o644)
		}, "not a PEM certificate"},
		"truncated certificate": {func(dir string) {
			raw, _ := os.ReadFile(filepath.Join(dirA, CertFile))
			os.WriteFile(filepath.Join(dir, CertFile), raw[:len(raw)/2], 0o644)
		}, "not a PEM certificate"},
		"missing key": {func(dir string) {
			copyFile(t, filepath.Join(dirA, CertFile), filepath.Join(dir, CertFile))
		}, "read platform CA key"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(dir)
			_, err := Load(dir)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func copyFile(t *testing.T, from, to string) {
	raw, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, raw, 0o600); err != nil {
		t.Fatal(err)
	}
}
