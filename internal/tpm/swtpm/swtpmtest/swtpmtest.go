// Package swtpmtest gives tests a real software TPM: a fresh swtpm per test,
// stopped at the end, and a failure if the test left transient objects loaded
// in the TPM (a leak that a real node would pay for with TPM_RC_OBJECT_MEMORY).
package swtpmtest

import (
	"context"
	"io"
	"testing"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/orrery-dev/orrery/internal/tpm/swtpm"
)

// Start starts swtpm with a fresh state in a test temporary directory.
func Start(tb testing.TB) *swtpm.Instance {
	tb.Helper()
	return StartWithState(tb, tb.TempDir())
}

// StartWithState starts swtpm on an existing state directory, for tests that
// restart a TPM and expect its NV contents to survive.
func StartWithState(tb testing.TB, stateDir string) *swtpm.Instance {
	tb.Helper()
	in, err := swtpm.Start(context.Background(), stateDir)
	if err != nil {
		tb.Fatalf("start swtpm: %v", err)
	}
	tb.Cleanup(func() {
		defer in.Stop()
		rw, err := in.Open()
		if err != nil {
			tb.Errorf("open swtpm to check for leaked handles: %v", err)
			return
		}
		defer rw.Close()
		if leaked := Handles(tb, rw); len(leaked) > 0 {
			tb.Errorf("test leaked %d transient TPM handles: %v", len(leaked), leaked)
		}
	})
	return in
}

// Handles lists the transient objects loaded in the TPM.
func Handles(tb testing.TB, rw io.ReadWriter) []string {
	tb.Helper()
	hs, err := client.Handles(rw, tpm2.HandleTypeTransient)
	if err != nil {
		tb.Fatalf("list transient TPM handles: %v", err)
	}
	var out []string
	for _, h := range hs {
		out = append(out, "0x"+hexHandle(uint32(h)))
	}
	return out
}

func hexHandle(h uint32) string {
	const digits = "0123456789abcdef"
	b := make([]byte, 8)
	for i := 7; i >= 0; i-- {
		b[i] = digits[h&0xf]
		h >>= 4
	}
	return string(b)
}

// Open opens the TPM and closes it when the test ends.
func Open(tb testing.TB, in *swtpm.Instance) io.ReadWriteCloser {
	tb.Helper()
	rw, err := in.Open()
	if err != nil {
		tb.Fatalf("open swtpm: %v", err)
	}
	tb.Cleanup(func() { rw.Close() })
	return rw
}
