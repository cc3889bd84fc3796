package main

import (
	"testing"

	"github.com/orrery-dev/orrery/internal/testkit/deptest"
)

// TestDeps keeps the inspect service small and read-only: nothing of the
// local cloud, the owner's side, the bootstrapper's flows, or a client of
// the API server, whose credentials it must not need.
func TestDeps(t *testing.T) {
	deptest.Forbid(t, "github.com/orrery-dev/orrery/internal/metadata",
		"github.com/orrery-dev/orrery/internal/cloud/",
		"github.com/orrery-dev/orrery/internal/owner/",
		"github.com/orrery-dev/orrery/cli/",
		"github.com/orrery-dev/orrery/bootstrapperd/",
		"github.com/orrery-dev/orrery/internal/keys",
		"k8s.io/client-go/",
		"helm.sh/",
	)
}
