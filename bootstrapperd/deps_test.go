package main

import (
	"testing"

	"github.com/orrery-dev/orrery/internal/testkit/deptest"
)

// TestDeps keeps the local cloud and the owner's side out of the node
// daemon: a node on a real cloud must not carry the test harness (the
// cloud's metadata server, its VMs and network) or the owner's flows in
// its binary. A node asks its cloud through internal/metadata's client.
func TestDeps(t *testing.T) {
	deptest.Forbid(t, "github.com/orrery-dev/orrery/internal/metadata",
		"github.com/orrery-dev/orrery/internal/cloud/",
		"github.com/orrery-dev/orrery/internal/owner/",
		"github.com/orrery-dev/orrery/cli/",
		"helm.sh/",
	)
}
