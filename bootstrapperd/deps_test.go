package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps the local cloud and the owner's side out of the node
// daemon: a node on a real cloud must not carry the test harness (the
// cloud's metadata server, its VMs and network) or the owner's flows in
// its binary. A node asks its cloud through internal/metadata's client.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	forbidden := []string{
		"github.com/orrery-dev/orrery/internal/cloud",
		"github.com/orrery-dev/orrery/internal/owner",
		"github.com/orrery-dev/orrery/cli",
		"helm.sh/",
	}
	var sawMetadata bool
	for _, pkg := range strings.Fields(string(out)) {
		sawMetadata = sawMetadata || pkg == "github.com/orrery-dev/orrery/internal/metadata"
		for _, f := range forbidden {
			if pkg == f || strings.HasPrefix(pkg, strings.TrimSuffix(f, "/")+"/") {
				t.Errorf("bootstrapperd imports %s (forbidden: %s)", pkg, f)
			}
		}
	}
	// The check above passes vacuously if go list names packages in
	// another form; the node's metadata client must show up.
	if !sawMetadata {
		t.Error("go list -deps does not list internal/metadata: the test no longer sees bootstrapperd's imports")
	}
}
