// Package kubereleasetest makes node roots that carry the image's
// Kubernetes releases, for tests of what switches between them.
package kubereleasetest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kuberelease"
	"github.com/orrery-dev/orrery/internal/versions"
)

// Root is a node root with every release's binaries where the image
// installs them; each binary's content is its release's version.
func Root(tb testing.TB) kuberelease.Node {
	tb.Helper()
	n := kuberelease.Node{Root: tb.TempDir()}
	for _, v := range versions.List() {
		dir, err := kuberelease.Folder(v)
		if err != nil {
			tb.Fatal(err)
		}
		for _, b := range kuberelease.Binaries {
			path := filepath.Join(n.Root, dir, b)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				tb.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(v), 0o755); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return n
}
