package main

import (
	"testing"

	"github.com/orrery-dev/orrery/internal/deptest"
)

// TestDeps keeps heavy dependencies out of /init: it runs before the OS,
// from a small initrd, under the same measurement as the rest of the boot.
func TestDeps(t *testing.T) {
	deptest.Forbid(t, "github.com/orrery-dev/orrery/internal/measurelog",
		"google.golang.org/grpc/",
		"k8s.io/",
		"sigs.k8s.io/",
		"github.com/spf13/cobra/",
	)
}
