package swtpm_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/orrery-dev/orrery/internal/tpm/swtpm"
)

// TestStatePersistsAcrossRestart checks what the local cloud relies on: what
// is written to NV before a VM boots is still there when swtpm is restarted
// on the same state directory.
func TestStatePersistsAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	const idx = tpmutil.Handle(0x01500001)
	want := []byte("provisioned before first boot")

	in, err := swtpm.Start(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	rw, err := in.Open()
	if err != nil {
		t.Fatal(err)
	}
	attrs := tpm2.AttrOwnerWrite | tpm2.AttrOwnerRead | tpm2.AttrAuthRead | tpm2.AttrPPRead
	if err := tpm2.NVDefineSpace(rw, tpm2.HandleOwner, idx, "", "", nil, attrs, uint16(len(want))); err != nil {
		t.Fatalf("define NV index: %v", err)
	}
	if err := tpm2.NVWrite(rw, tpm2.HandleOwner, idx, "", want, 0); err != nil {
		t.Fatalf("write NV index: %v", err)
	}
	rw.Close()
	if err := in.Stop(); err != nil {
		t.Fatal(err)
	}

	in, err = swtpm.Start(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Stop()
	rw, err = in.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	got, err := tpm2.NVReadEx(rw, idx, tpm2.HandleOwner, "", 0)
	if err != nil {
		t.Fatalf("read NV index after restart: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("NV after restart = %q, want %q", got, want)
	}
	// A restart is a reboot: PCRs start from zero again.
	pcr, err := tpm2.ReadPCR(rw, 15, tpm2.AlgSHA256)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pcr, make([]byte, 32)) {
		t.Fatalf("PCR 15 after restart = %x, want zero", pcr)
	}
}

// TestOpenIsExclusive checks that a second Open waits for the first Close,
// so concurrent users never interleave TPM commands on one socket.
func TestOpenIsExclusive(t *testing.T) {
	in, err := swtpm.Start(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Stop()
	first, err := in.Open()
	if err != nil {
		t.Fatal(err)
	}
	opened := make(chan struct{})
	go func() {
		rw, err := in.Open()
		if err == nil {
			rw.Close()
		}
		close(opened)
	}()
	// While first is open, a PCR read through it still works.
	if _, err := client.ReadAllPCRs(first); err != nil {
		t.Fatalf("read PCRs: %v", err)
	}
	select {
	case <-opened:
		t.Fatal("second Open returned while the first connection was open")
	default:
	}
	first.Close()
	<-opened
}

// swtpm cannot take a comma in its state directory; Start says so instead
// of failing with swtpm's empty log.
func TestStartRefusesACommaInTheStateDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a,b")
	_, err := swtpm.Start(context.Background(), dir)
	if err == nil || !strings.Contains(err.Error(), "comma") {
		t.Fatalf("err %v, want one that names the comma", err)
	}
	if _, statErr := os.Stat(dir); !os.IsNotExist(statErr) {
		t.Errorf("Start left %s behind (%v)", dir, statErr)
	}
}
