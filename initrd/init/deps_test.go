package main

import (
	"testing"

	"github.com/orrery-dev/orrery/internal/testkit/deptest"
)

// TestDeps keeps heavy dependencies out of /init: it runs before the OS,
// from a small initrd, under the same measurement as the rest of the boot.
// gRPC is in: a rejoin and a recovery speak it over attested TLS, as every
// other Orrery service does. With them (and the attestation issuer, the
// DHCP client, the metadata client) the initrd grew from 7.6 to 10.6 MB
// compressed, 20.6 to 29.5 MB unpacked (go run ./initrd/mkinitrd).
func TestDeps(t *testing.T) {
	deptest.Forbid(t, "github.com/orrery-dev/orrery/internal/tpm/pcrlog",
		// Kubernetes' libraries (sigs.k8s.io/yaml, which reads
		// measurement files, is small and allowed).
		"k8s.io/",
		"sigs.k8s.io/controller-runtime/",
		"sigs.k8s.io/structured-merge-diff/",
		"sigs.k8s.io/kustomize/",
		"helm.sh/",
		"github.com/spf13/cobra/",
	)
}
