// Package deptest keeps dependencies out of a program: a program's test
// lists what the program must never import, and Forbid fails the test if
// it does, through any path.
package deptest

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Forbid fails t if the package in the current directory imports, directly
// or not, a package named in forbidden, or any package under one that ends
// in "/". It fails too if must, which the package does import, is missing
// from the list: then the check no longer sees the package's imports.
func Forbid(t *testing.T, must string, forbidden ...string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	for _, pkg := range deps {
		for _, f := range forbidden {
			if pkg == strings.TrimSuffix(f, "/") || strings.HasPrefix(pkg, strings.TrimSuffix(f, "/")+"/") {
				t.Errorf("imports %s (forbidden: %s)", pkg, f)
			}
		}
	}
	if !slices.Contains(deps, must) {
		t.Errorf("go list -deps does not list %s: the test no longer sees the package's imports", must)
	}
}
