// Package kuberelease points a node's kubeadm, kubelet and kubectl at one
// of the Kubernetes releases its image carries.
//
// The image carries each release's binaries in a folder of their own on
// the read-only root (/usr/lib/orrery/kubernetes/vX.Y.Z), and its
// /usr/bin/kubeadm, kubelet and kubectl are links through Link, which
// lives on /run: the node chooses the release at run time, from what
// proves the cluster's version (the owner's init, a join or rejoin
// ticket, the control plane's checked static pods), and the choice
// vanishes with the boot. Nothing on the state disk chooses it.
package kuberelease

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/orrery-dev/orrery/internal/versions"
)

// Link is the link /usr/bin/kubeadm, kubelet and kubectl lead through:
// to the folder of the release the node runs.
const Link = "/run/orrery/kubernetes"

// ErrNone means the node runs no release yet: it has not been told its
// cluster's version this boot.
var ErrNone = errors.New("no Kubernetes release chosen on this node yet")

// Node is a node's root: "/" on a node, a folder in tests.
type Node struct {
	Root string
}

// Activate points Link at the folder of version, which the image must
// carry, replacing any earlier choice at once (a rename): a program that
// starts after it returns runs version.
func (n Node) Activate(version string) error {
	dir, err := Folder(version)
	if err != nil {
		return err
	}
	for _, name := range Binaries {
		if _, err := os.Stat(filepath.Join(n.Root, dir, name)); err != nil {
			return fmt.Errorf("the image lacks %s of Kubernetes %s: %w", name, version, err)
		}
	}
	link := filepath.Join(n.Root, Link)
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return err
	}
	tmp := link + ".new"
	_ = os.Remove(tmp)
	if err := os.Symlink(target(dir), tmp); err != nil {
		return fmt.Errorf("choose Kubernetes %s: %w", version, err)
	}
	if err := os.Rename(tmp, link); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("choose Kubernetes %s: %w", version, err)
	}
	return nil
}

// Active is the version Link points at, ErrNone if it points nowhere.
func (n Node) Active() (string, error) {
	dir, err := os.Readlink(filepath.Join(n.Root, Link))
	if errors.Is(err, os.ErrNotExist) {
		return "", ErrNone
	}
	if err != nil {
		return "", err
	}
	v := filepath.Base(dir)
	if want, err := Folder(v); err != nil || target(want) != dir {
		return "", fmt.Errorf("%s leads to %s, no release this image carries", Link, dir)
	}
	return v, nil
}

// target is what Link holds to lead to the release folder dir: a path
// relative to Link's own folder, so that it leads there under any root
// (the node's, or a test's).
func target(dir string) string {
	rel, err := filepath.Rel(filepath.Dir(Link), dir)
	if err != nil {
		return dir
	}
	return rel
}

// Binaries are the programs of a release that live in its folder.
var Binaries = []string{"kubeadm", "kubelet", "kubectl"}

// Folder is where the image keeps version's binaries: the folder of each
// of Binaries in the release's manifest, which must be one.
func Folder(version string) (string, error) {
	r, err := versions.Get(version)
	if err != nil {
		return "", err
	}
	var dir string
	for _, name := range Binaries {
		b, ok := r.Binary(name)
		if !ok {
			return "", fmt.Errorf("the image's manifest of Kubernetes %s has no %s", version, name)
		}
		d := filepath.Dir(b.InstallPath)
		if dir != "" && d != dir || filepath.Base(b.InstallPath) != name || !strings.HasSuffix(d, "/"+version) {
			return "", fmt.Errorf("the image's manifest of Kubernetes %s installs %s at %s, not in the release's own folder", version, name, b.InstallPath)
		}
		dir = d
	}
	return dir, nil
}
