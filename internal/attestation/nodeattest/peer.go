package nodeattest

import (
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"

	"github.com/orrery-dev/orrery/internal/attestation/snp"
	"github.com/orrery-dev/orrery/internal/attestation/tdx"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
)

// PeerPolicy is what a node holds a peer of its own image and platform
// to: the variant the peer must attest as, which is the node's own, and
// what the peer's hardware evidence must show (Platform.PeerPolicy makes
// it from the node's own evidence).
type PeerPolicy struct {
	// Variant is the node's own.
	Variant variant.Variant
	// SEVSNP is what the peer's SEV-SNP report must show; set for
	// gcp-sev-snp.
	SEVSNP *snp.Policy
	// TDX is what the peer's TD quote must show; set for gcp-tdx.
	TDX *tdx.Policy
	// TDXRoots replace Intel's SGX Root CA as the roots the peer's TD
	// quote must chain to: only for tests, whose quotes a test PKI
	// signs (tdxtest). No platform Detect finds sets them. Nil is
	// Intel's.
	TDXRoots *x509.CertPool
}

// TEEVerifier returns the verifier of the peer's hardware evidence, or
// nil for qemu-vtpm, which has none. A node has no collateral cache, so
// the verifier checks no revocation (SEV-SNP: no CRL; TDX: no CRL and no
// TCB status either); the owner's commands and the join service, which
// have the cache, check them. It checks everything else: the signature
// and the chain to AMD's or Intel's roots (or the test root the policy
// names), that the evidence binds the session, no debug guest, Intel's
// quoting enclave, and the policy's measurements.
func (p PeerPolicy) TEEVerifier() (vtpm.TEEVerifier, error) {
	// The checks skipped are known and documented; a warning at every
	// handshake would tell an operator nothing new.
	quiet := slog.New(slog.DiscardHandler)
	switch p.Variant {
	case variant.QEMUVTPM:
		return nil, nil
	case variant.GCPSEVSNP:
		if p.SEVSNP == nil {
			return nil, errors.New("no SEV-SNP policy for the peer of an SEV-SNP node")
		}
		v, err := snp.NewVerifier(snp.Config{Policy: *p.SEVSNP, SkipRevocationCheck: true, Logger: quiet})
		if err != nil {
			return nil, err
		}
		return v, nil
	case variant.GCPTDX:
		if p.TDX == nil {
			return nil, errors.New("no TDX policy for the peer of a TDX node")
		}
		v, err := tdx.NewVerifier(tdx.Config{Policy: *p.TDX, SkipCollateral: true, TrustedRoots: p.TDXRoots, Logger: quiet})
		if err != nil {
			return nil, err
		}
		return v, nil
	}
	return nil, fmt.Errorf("no peer policy for a %s node", p.Variant)
}

// ImageBound reports whether the policy holds the peer to this node's
// own image in its hardware evidence: a TDX node's RTMRs measure its
// boot chain. Such a policy refuses a peer of any other image, whatever
// its PCRs.
func (p PeerPolicy) ImageBound() bool { return p.Variant == variant.GCPTDX }

// Describe says, for an error, what the peer's hardware evidence must
// show; "" for qemu-vtpm.
func (p PeerPolicy) Describe() string {
	switch p.Variant {
	case variant.GCPSEVSNP:
		return "an SEV-SNP report with this node's launch measurement"
	case variant.GCPTDX:
		return fmt.Sprintf("a TD quote chained to Intel's root, from Intel's quoting enclave, with this node's MRTD and RTMRs %v", tdx.PeerRTMRs)
	}
	return ""
}
