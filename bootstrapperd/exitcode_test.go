package main

import (
	"context"
	"errors"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation/nodeattest"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/testkit/syncbuffer"
)

// A node that refuses what its platform offers stops with exitRefused,
// which its unit does not restart on; any other failure is 1.
func TestARefusedPlatformIsNotRestarted(t *testing.T) {
	n := qemutest.NewNode(t)
	var logs syncbuffer.Buffer
	b := testBootstrapper(t, n.TPM.Open, t.TempDir(), &logs)
	b.platform = func(context.Context) (nodeattest.Platform, error) {
		return nodeattest.Platform{}, &nodeattest.RefusedError{Reason: "a cloud image told it is simulated"}
	}
	err := run(context.Background(), b)
	if got := exitCode(err); got != exitRefused {
		t.Fatalf("run: %v; exit status %d, want %d", err, got, exitRefused)
	}
	if exitCode(nil) != 0 || exitCode(errors.New("the TPM is away")) != 1 {
		t.Error("exit status of success or of another failure is not 0 or 1")
	}
}
