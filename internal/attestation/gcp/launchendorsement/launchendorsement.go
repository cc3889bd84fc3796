// Package launchendorsement verifies Google's launch endorsements: the
// documents in which Google states, for one build of its Confidential VM
// firmware, the SEV-SNP launch measurement that firmware gives for each
// vCPU count and the TDX MRTD for each memory size, signed by a key whose
// certificate chains to Google's root for confidential computing
// (GCE-cc-tcb-root).
//
// The launch measurement covers the firmware, the VMSA of every vCPU and
// the metadata pages, which depend on how Google's VMM builds them; only
// Google's tooling computes them for its firmware. Orrery therefore takes
// the published values and verifies Google's signature over them instead
// of predicting them (docs/confidential-clouds.md says why). The owner
// names Google's root; nothing here trusts a root by default.
//
// An endorsement is untrusted input until verified: on SEV-SNP the host
// attaches it to the extended report's certificate table, and an owner
// may keep copies in a collateral cache. Its wire format is a protobuf
// (VMLaunchEndorsement, whose signed bytes are a VMGoldenMeasurement)
// read here field by field.
package launchendorsement

import (
	"bytes"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// SNPCertTableGUID is the GUID under which GCE's host puts the
// endorsement of the VM's firmware into the SEV-SNP extended report's
// certificate table (go-sev-guest's CertificateChain.Extras).
const SNPCertTableGUID = "9f4116cd-c503-4f5a-8f6f-fb68882f4ce2"

// MaxSize bounds an endorsement: Google's are a few kilobytes (a
// certificate, a CA bundle, a few dozen measurements).
const MaxSize = 256 << 10

// bucketURL is where Google publishes endorsements, one object per
// measurement.
const bucketURL = "https://storage.googleapis.com/gce_tcb_integrity/ovmf_x64_csm/"

// SNPURL is where Google publishes the endorsement of the firmware whose
// SEV-SNP launch measurement is measurement.
func SNPURL(measurement []byte) string {
	return bucketURL + "sevsnp/" + hex.EncodeToString(measurement) + ".binarypb"
}

// TDXURLPrefix starts every TDXURL.
const TDXURLPrefix = bucketURL + "tdx/"

// TDXURL is where Google publishes the endorsement of the firmware whose
// TDX MRTD is mrtd.
func TDXURL(mrtd []byte) string {
	return TDXURLPrefix + hex.EncodeToString(mrtd) + ".binarypb"
}

// Golden is a verified endorsement: what Google signed about one
// firmware build.
type Golden struct {
	// Signed is when Google signed it.
	Signed time.Time
	// Changelist and Commit name the source the firmware was built from.
	Changelist uint64
	Commit     []byte
	// UEFIDigest is the SHA-384 of the firmware binary Google publishes.
	UEFIDigest []byte
	// Signer is the certificate of the key that signed it.
	Signer *x509.Certificate
	SNP    *SNP
	TDX    *TDX
}

// SNP is what Google states about the firmware on SEV-SNP.
type SNP struct {
	SVN uint32
	// Measurements are the launch measurements by the number of VMSAs
	// measured at launch.
	Measurements map[uint32][]byte
	// Policy is the guest policy Google launches the firmware with.
	Policy uint64
	// FamilyID and ImageID are the UUIDs Google gives its firmware
	// family and this build.
	FamilyID, ImageID []byte
	// SVSMMeasurement is the measurement under an SVSM; Orrery's nodes
	// run at VMPL 0, without one, so it is never accepted here.
	SVSMMeasurement []byte
}

// TDX is what Google states about the firmware on TDX.
type TDX struct {
	SVN          uint32
	Measurements []TDXMeasurement
}

// TDXMeasurement is the MRTD of one memory configuration.
type TDXMeasurement struct {
	RAMGiB      uint32
	EarlyAccept bool
	MRTD        []byte
}

// Verify parses an endorsement and checks that its signing key's
// certificate chains to one of roots at now and that the key signed the
// golden measurement (RSA-PSS with SHA-256, as Google signs). The
// certificates the endorsement itself carries serve only as
// intermediates.
func Verify(blob []byte, roots *x509.CertPool, now time.Time) (*Golden, error) {
	if roots == nil {
		return nil, errors.New("launch endorsement: no root to verify it against")
	}
	if len(blob) > MaxSize {
		return nil, fmt.Errorf("launch endorsement: %d bytes, more than the %d any endorsement has", len(blob), MaxSize)
	}
	signed, signature, err := parseEndorsement(blob)
	if err != nil {
		return nil, fmt.Errorf("launch endorsement is malformed: %w", err)
	}
	raw, err := parseGolden(signed)
	if err != nil {
		return nil, fmt.Errorf("launch endorsement's golden measurement is malformed: %w", err)
	}
	signer, err := checkSigner(raw, roots, now)
	if err != nil {
		return nil, err
	}
	if err := signer.CheckSignature(x509.SHA256WithRSAPSS, signed, signature); err != nil {
		return nil, fmt.Errorf("launch endorsement's signature does not verify with the key of %q: the document was altered, or signed by another key: %w", signer.Subject.CommonName, err)
	}
	g := raw.golden
	g.Signer = signer
	return &g, nil
}

func checkSigner(raw goldenFields, roots *x509.CertPool, now time.Time) (*x509.Certificate, error) {
	if len(raw.cert) == 0 {
		return nil, errors.New("launch endorsement names no signing certificate")
	}
	signer, err := x509.ParseCertificate(raw.cert)
	if err != nil {
		return nil, fmt.Errorf("launch endorsement's signing certificate: %w", err)
	}
	if _, ok := signer.PublicKey.(*rsa.PublicKey); !ok {
		return nil, fmt.Errorf("launch endorsement's signing key is %T, not the RSA key Google signs with", signer.PublicKey)
	}
	// Google's root certifies its signing keys directly (it may certify
	// no CA below it), so the CA bundle the document carries is not
	// needed, and is not read: Google fills it from a file of its own
	// whose format it does not promise.
	_, err = signer.Verify(x509.VerifyOptions{
		Roots:       roots,
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return nil, fmt.Errorf("launch endorsement's signer %q is not certified by the root the owner named (Google's GCE-cc-tcb-root) at %s: %w", signer.Subject.CommonName, now.UTC().Format(time.RFC3339), err)
	}
	if signer.IsCA || signer.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		return nil, fmt.Errorf("launch endorsement's signer %q is not a document-signing certificate (a CA, or no digitalSignature key usage): Google signs with a leaf certificate for digital signatures only", signer.Subject.CommonName)
	}
	return signer, nil
}

// LaunchVMSAsFor returns the number of VMSAs measured at launch (the
// VM's vCPUs, or 1 where the firmware starts the others later) for
// which Google endorsed measurement. An error says the firmware is not
// SEV-SNP-endorsed or the measurement is none of its.
func (g *Golden) LaunchVMSAsFor(measurement []byte) (uint32, error) {
	if g.SNP == nil {
		return 0, errors.New("the launch endorsement says nothing about SEV-SNP: it endorses the firmware for another technology")
	}
	for vmsas, m := range g.SNP.Measurements {
		if bytes.Equal(m, measurement) {
			return vmsas, nil
		}
	}
	return 0, fmt.Errorf("the launch measurement %s is none of the %d the endorsement of UEFI %s lists: the host launched the firmware with other contents or a VM shape Google did not endorse", hex.EncodeToString(measurement), len(g.SNP.Measurements), shortHex(g.UEFIDigest))
}

// TDXConfigurationFor returns the memory configuration whose MRTD
// Google endorsed as mrtd.
func (g *Golden) TDXConfigurationFor(mrtd []byte) (TDXMeasurement, error) {
	if g.TDX == nil {
		return TDXMeasurement{}, errors.New("the launch endorsement says nothing about TDX: it endorses the firmware for another technology")
	}
	for _, m := range g.TDX.Measurements {
		if bytes.Equal(m.MRTD, mrtd) {
			return m, nil
		}
	}
	return TDXMeasurement{}, fmt.Errorf("the MRTD %s is none of the %d the endorsement of UEFI %s lists: the host launched other firmware contents or a memory size Google did not endorse", hex.EncodeToString(mrtd), len(g.TDX.Measurements), shortHex(g.UEFIDigest))
}

// Describe is one line for `orrery verify`: which firmware, when signed.
func (g *Golden) Describe() string {
	return fmt.Sprintf("Google-signed UEFI %s (signed %s by %q)", shortHex(g.UEFIDigest), g.Signed.UTC().Format(time.DateOnly), g.Signer.Subject.CommonName)
}

func shortHex(b []byte) string {
	s := hex.EncodeToString(b)
	if len(s) > 16 {
		return s[:16] + "…"
	}
	return s
}
