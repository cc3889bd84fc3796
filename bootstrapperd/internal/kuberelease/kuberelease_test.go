package kuberelease

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/versions"
)

// imageRoot is a node root with every release's binaries where the image
// installs them.
func imageRoot(t *testing.T) Node {
	t.Helper()
	n := Node{Root: t.TempDir()}
	for _, v := range versions.List() {
		dir, err := Folder(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(n.Root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, b := range Binaries {
			if err := os.WriteFile(filepath.Join(n.Root, dir, b), []byte(v), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	return n
}

func TestActivateSwitchesRelease(t *testing.T) {
	n := imageRoot(t)
	if _, err := n.Active(); !errors.Is(err, ErrNone) {
		t.Fatalf("Active before any choice: %v, want ErrNone", err)
	}
	for _, v := range append(versions.List(), versions.List()[0]) {
		if err := n.Activate(v); err != nil {
			t.Fatalf("Activate(%s): %v", v, err)
		}
		if got, err := n.Active(); err != nil || got != v {
			t.Fatalf("Active after Activate(%s) = %q, %v", v, got, err)
		}
		// /usr/bin/kubelet's link leads through Link to this release's
		// kubelet.
		b, err := os.ReadFile(filepath.Join(n.Root, Link, "kubelet"))
		if err != nil || string(b) != v {
			t.Fatalf("kubelet through %s after Activate(%s): %q, %v", Link, v, b, err)
		}
	}
}

func TestActivateRefuses(t *testing.T) {
	n := imageRoot(t)
	first := versions.List()[0]
	if err := n.Activate(first); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"v1.20.0", "", "../../../bin", "v1.37", first + "/.."} {
		err := n.Activate(v)
		var ue *versions.UnsupportedError
		if !errors.As(err, &ue) {
			t.Errorf("Activate(%q) = %v, want an *versions.UnsupportedError", v, err)
		}
	}
	// A release the manifest names whose binaries the root lacks.
	last := versions.List()[len(versions.List())-1]
	dir, _ := Folder(last)
	if err := os.Remove(filepath.Join(n.Root, dir, "kubelet")); err != nil {
		t.Fatal(err)
	}
	if err := n.Activate(last); err == nil || !strings.Contains(err.Error(), "the image lacks kubelet of Kubernetes "+last) {
		t.Errorf("Activate of a release without its kubelet: %v", err)
	}
	// Every refusal kept the earlier choice.
	if got, err := n.Active(); err != nil || got != first {
		t.Errorf("Active after refusals = %q, %v; want %s", got, err, first)
	}
}

func TestActiveRefusesAForeignLink(t *testing.T) {
	n := imageRoot(t)
	link := filepath.Join(n.Root, Link)
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"/tmp/evil", "/usr/lib/orrery/kubernetes/v9.9.9", "relative"} {
		os.Remove(link)
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		if v, err := n.Active(); err == nil {
			t.Errorf("Active with %s -> %s = %q, want an error", Link, target, v)
		}
	}
}

func TestEveryReleaseHasItsOwnFolder(t *testing.T) {
	seen := map[string]string{}
	for _, v := range versions.List() {
		dir, err := Folder(v)
		if err != nil {
			t.Fatal(err)
		}
		if other, ok := seen[dir]; ok {
			t.Errorf("%s and %s share %s", v, other, dir)
		}
		seen[dir] = v
	}
}
