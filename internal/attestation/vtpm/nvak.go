package vtpm

import (
	"crypto/x509"
	"fmt"
	"io"
	"sync"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
)

// NVAK loads an attestation key whose template and certificate the
// platform wrote to NV indexes (GCE's ECC AK, which the local cloud
// provisions the same way), as client.GceAttestationKeyECC does. Unlike it,
// NVAK reads the two NV indexes only until a load has found both, and
// recreates the key from what it read after that.
//
// Reading them is six of the thirteen TPM commands of an attestation, and
// a long-running service (the join service, the inspect service,
// bootstrapperd) attests on every handshake. The platform writes them once,
// before the VM first boots; whoever could rewrite them later controls the
// vTPM anyway. A certificate that does not match the recreated key is
// refused, as in go-tpm-tools.
type NVAK struct {
	TemplateIndex, CertIndex uint32

	mu       sync.Mutex
	template *tpm2.Public
	cert     *x509.Certificate
}

// Load recreates the AK under the endorsement hierarchy of rw's TPM with
// its certificate set (none if the certificate's index cannot be read).
func (a *NVAK) Load(rw io.ReadWriter) (*client.Key, error) {
	a.mu.Lock()
	template, cert := a.template, a.cert
	a.mu.Unlock()
	if template == nil {
		data, err := tpm2.NVReadEx(rw, tpmutil.Handle(a.TemplateIndex), tpm2.HandleOwner, "", 0)
		if err != nil {
			return nil, fmt.Errorf("read the AK template at NV index %#x: %w", a.TemplateIndex, err)
		}
		t, err := tpm2.DecodePublic(data)
		if err != nil {
			return nil, fmt.Errorf("NV index %#x holds no TPM key template: %w", a.TemplateIndex, err)
		}
		template = &t
	}
	if cert == nil {
		// A missing certificate is not an error here, as in go-tpm-tools:
		// the validator refuses an AK without one unless told to trust any.
		if der, err := tpm2.NVReadEx(rw, tpmutil.Handle(a.CertIndex), tpm2.HandleOwner, "", 0); err == nil {
			if cert, err = x509.ParseCertificate(der); err != nil {
				return nil, fmt.Errorf("the AK certificate at NV index %#x does not parse: %w", a.CertIndex, err)
			}
		}
	}

	k, err := client.NewKey(rw, tpm2.HandleEndorsement, *template)
	if err != nil {
		return nil, fmt.Errorf("recreate the AK from its template: %w", err)
	}
	if cert != nil {
		if err := k.SetCert(cert); err != nil {
			k.Close()
			// Read both again next time, in case the platform has
			// re-provisioned the vTPM.
			a.mu.Lock()
			a.template, a.cert = nil, nil
			a.mu.Unlock()
			return nil, fmt.Errorf("the AK certificate at NV index %#x: %w", a.CertIndex, err)
		}
		a.mu.Lock()
		a.template, a.cert = template, cert
		a.mu.Unlock()
	}
	return k, nil
}
