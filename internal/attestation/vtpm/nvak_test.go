package vtpm_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"strings"
	"testing"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm/swtpmtest"
)

func newNVAK() *vtpm.NVAK {
	return &vtpm.NVAK{TemplateIndex: client.GceAKTemplateNVIndexECC, CertIndex: client.GceAKCertNVIndexECC}
}

// nvReads counts the NV_Read commands sent through it.
type nvReads struct {
	io.ReadWriter
	n int
}

func (r *nvReads) Write(p []byte) (int, error) {
	if len(p) >= 10 && binary.BigEndian.Uint32(p[6:10]) == uint32(tpm2.CmdReadNV) {
		r.n++
	}
	return r.ReadWriter.Write(p)
}

func TestNVAKKeepsTemplateAndCertificate(t *testing.T) {
	rw := swtpmtest.Open(t, swtpmtest.Start(t))
	defer rw.Close()
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.ProvisionAK(rw, platformca.NewInstance("node-0"))
	if err != nil {
		t.Fatal(err)
	}

	ak := newNVAK()
	counted := &nvReads{ReadWriter: rw}
	for i, wantReads := range []int{2, 0} {
		counted.n = 0
		k, err := ak.Load(counted)
		if err != nil {
			t.Fatalf("load %d: %v", i, err)
		}
		if k.Cert() == nil || !bytes.Equal(k.Cert().Raw, cert.Raw) {
			t.Errorf("load %d: the key's certificate is not the one provisioned", i)
		}
		if err := k.Cert().CheckSignatureFrom(ca.Cert); err != nil {
			t.Errorf("load %d: %v", i, err)
		}
		k.Close()
		if counted.n != wantReads {
			t.Errorf("load %d read NV %d times, want %d", i, counted.n, wantReads)
		}
	}
}

func TestNVAKRefusesBadPlatformData(t *testing.T) {
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		// certificate is what the certificate's NV index holds; nil leaves
		// the vTPM unprovisioned.
		certificate []byte
		want        string
	}{
		{"not provisioned", nil, "read the AK template at NV index 0x1c10003"},
		{"garbage certificate", []byte("not a certificate"), "does not parse"},
		{"another key's certificate", ca.Cert.Raw, "does not match key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rw := swtpmtest.Open(t, swtpmtest.Start(t))
			defer rw.Close()
			if tc.certificate != nil {
				if _, err := ca.ProvisionAK(rw, platformca.NewInstance("node-0")); err != nil {
					t.Fatal(err)
				}
				replaceNV(t, rw, client.GceAKCertNVIndexECC, tc.certificate)
			}
			ak := newNVAK()
			if k, err := ak.Load(rw); err == nil {
				k.Close()
				t.Fatal("loaded")
			} else if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to say %q", err, tc.want)
			}
			if tc.certificate == nil {
				return
			}
			// Once the platform writes a good certificate, the same
			// loader takes it: it kept nothing from the failed load.
			if _, err := ca.ProvisionAK(rw, platformca.NewInstance("node-0")); err != nil {
				t.Fatal(err)
			}
			k, err := ak.Load(rw)
			if err != nil {
				t.Fatalf("after re-provisioning: %v", err)
			}
			k.Close()
		})
	}
}

func replaceNV(t *testing.T, rw io.ReadWriter, index uint32, data []byte) {
	t.Helper()
	h := tpmutil.Handle(index)
	if err := tpm2.NVUndefineSpace(rw, "", tpm2.HandleOwner, h); err != nil {
		t.Fatal(err)
	}
	attrs := tpm2.AttrOwnerWrite | tpm2.AttrOwnerRead | tpm2.AttrAuthRead | tpm2.AttrNoDA
	if err := tpm2.NVDefineSpace(rw, tpm2.HandleOwner, h, "", "", nil, attrs, uint16(len(data))); err != nil {
		t.Fatal(err)
	}
	if err := tpm2.NVWrite(rw, tpm2.HandleOwner, h, "", data, 0); err != nil {
		t.Fatal(err)
	}
}
