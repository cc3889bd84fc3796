package handoff

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/orrery-dev/orrery/internal/versions"
)

func TestClusterVersionRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster-kubernetes-version")
	if _, err := ReadClusterVersion(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("nothing written: %v, want os.ErrNotExist", err)
	}
	for _, v := range versions.List() {
		if err := WriteClusterVersion(path, v); err != nil {
			t.Fatal(err)
		}
		if got, err := ReadClusterVersion(path); err != nil || got != v {
			t.Fatalf("ReadClusterVersion = %q, %v; want %s", got, err, v)
		}
	}
}

func TestClusterVersionRefusesWhatTheImageLacks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster-kubernetes-version")
	var ue *versions.UnsupportedError
	if err := WriteClusterVersion(path, "v1.20.0"); !errors.As(err, &ue) {
		t.Fatalf("WriteClusterVersion(v1.20.0) = %v, want an *versions.UnsupportedError", err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatal("a refused version was written")
	}
	for _, planted := range []string{"v1.20.0", versions.Default + "\n", "", "../../bin"} {
		if err := os.WriteFile(path, []byte(planted), 0o644); err != nil {
			t.Fatal(err)
		}
		if v, err := ReadClusterVersion(path); !errors.As(err, &ue) {
			t.Errorf("ReadClusterVersion of %q = %q, %v; want an *versions.UnsupportedError", planted, v, err)
		}
	}
}
