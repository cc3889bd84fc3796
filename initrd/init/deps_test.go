package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps heavy dependencies out of /init: it runs before the OS,
// from a small initrd, under the same measurement as the rest of the boot.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	forbidden := []string{
		"google.golang.org/grpc",
		"k8s.io/",
		"sigs.k8s.io/",
		"github.com/spf13/cobra",
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if pkg == f || strings.HasPrefix(pkg, f) && (strings.HasSuffix(f, "/") || strings.HasPrefix(pkg, f+"/")) {
				t.Errorf("/init imports %s (forbidden: %s)", pkg, f)
			}
		}
	}
}
