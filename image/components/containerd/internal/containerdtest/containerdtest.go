// Package containerdtest builds the containerd this module pins, for tests
// that run it.
package containerdtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Build builds containerd into dir and returns the binary's path.
func Build(ctx context.Context, t testing.TB, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "containerd")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/containerd/containerd/v2/cmd/containerd")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build containerd: %v\n%s", err, out)
	}
	return bin
}
