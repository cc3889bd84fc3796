package qemu_test

import (
	"io"
	"strings"
	"testing"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm/swtpmtest"
)

func TestReadPlatformCA(t *testing.T) {
	n := newNode(t)
	withTPM(t, n.tpm, func(rw io.ReadWriter) {
		ca, err := qemu.ReadPlatformCA(rw)
		if err != nil {
			t.Fatal(err)
		}
		if !ca.Equal(n.ca.Cert) {
			t.Fatal("read a different CA than the one that provisioned the vTPM")
		}
	})
}

// A CA certificate in NV that did not certify the vTPM's own AK is no
// trust anchor: whoever put it there is not the platform behind this node.
func TestReadPlatformCARefusesForeignCA(t *testing.T) {
	n := newNode(t)
	other, err := platformca.New("another cloud")
	if err != nil {
		t.Fatal(err)
	}
	withTPM(t, n.tpm, func(rw io.ReadWriter) {
		idx := tpmutil.Handle(platformca.CACertNVIndex)
		if err := tpm2.NVUndefineSpace(rw, "", tpm2.HandleOwner, idx); err != nil {
			t.Fatal(err)
		}
		der := other.Cert.Raw
		attrs := tpm2.AttrOwnerWrite | tpm2.AttrOwnerRead | tpm2.AttrAuthRead | tpm2.AttrNoDA
		if err := tpm2.NVDefineSpace(rw, tpm2.HandleOwner, idx, "", "", nil, attrs, uint16(len(der))); err != nil {
			t.Fatal(err)
		}
		for off := 0; off < len(der); off += 256 {
			if err := tpm2.NVWrite(rw, tpm2.HandleOwner, idx, "", der[off:min(off+256, len(der))], uint16(off)); err != nil {
				t.Fatal(err)
			}
		}
		_, err := qemu.ReadPlatformCA(rw)
		if err == nil || !strings.Contains(err.Error(), "did not sign") {
			t.Fatalf("err = %v, want a refusal of a CA that did not sign this vTPM's AK", err)
		}
	})
}

func TestReadPlatformCAUnprovisioned(t *testing.T) {
	in := swtpmtest.Start(t)
	withTPM(t, in, func(rw io.ReadWriter) {
		_, err := qemu.ReadPlatformCA(rw)
		if err == nil || !strings.Contains(err.Error(), "provisioned") {
			t.Fatalf("err = %v, want a hint that the vTPM is not provisioned", err)
		}
	})
}
