// Package validator builds the validator that checks a node against an
// owner's policy (package policy): the policy's variant decides which
// one, so every verifier (the owner's CLI, the join service) admits
// exactly the kind of node the owner's measurements describe.
package validator

import (
	"crypto/x509"
	"errors"
	"log/slog"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/gcp"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/snp"
	"github.com/orrery-dev/orrery/internal/attestation/tdx"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
)

// Config configures New.
type Config struct {
	// Policy is what the node must show. Required.
	Policy policy.Policy
	// PlatformCAs certify the vTPM's attestation key: the local cloud's
	// platform CA, whose certificates name instances its way. Nil, for
	// the GCP variants, means Google's EK/AK CAs and GCE's instance
	// extension; the qemu-vtpm variant needs them (or TrustAnyAK).
	PlatformCAs []*x509.Certificate
	// TrustAnyAK accepts any attestation key: development only, and
	// only for qemu-vtpm (a hardware variant whose AK nobody certified
	// would still rest on the hardware report, but its PCRs would not).
	TrustAnyAK bool
	// NonZero lists PCRs that must not be zero (see vtpm).
	NonZero []uint32
	// Collateral is the owner's cache of the CPU vendors' collateral.
	Collateral Collateral
	// Now is the clock for certificates; nil means time.Now.
	Now func() time.Time
	// Logger receives warnings; nil discards them.
	Logger *slog.Logger
}

// Collateral is what verification needs from the CPU vendors besides the
// evidence, from caches the owner fills (verification uses no network).
type Collateral struct {
	// SNP serves AMD's CRLs and certificates the evidence lacks (see
	// snp.Collateral); a test root brings its own CRL. Nil is empty.
	SNP snp.Collateral
	// TDX serves Intel's TCB info, QE identity and CRLs; a gcp-tdx
	// policy needs it.
	TDX tdx.Collateral
}

// Dirs is the collateral of two cache directories; an empty path leaves
// that vendor's cache out.
func Dirs(snpDir, tdxDir string) Collateral {
	var c Collateral
	if snpDir != "" {
		c.SNP = snp.CollateralDir(snpDir)
	}
	if tdxDir != "" {
		c.TDX = tdx.CollateralDir(tdxDir)
	}
	return c
}

// New returns the validator of the policy's variant.
func New(cfg Config) (*vtpm.Validator, error) {
	p := cfg.Policy
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if cfg.TrustAnyAK && p.SEVSNP != nil || cfg.TrustAnyAK && p.TDX != nil {
		return nil, ErrTrustAnyAKWithHardware
	}
	switch {
	case p.SEVSNP != nil:
		tv, err := snp.NewVerifier(snp.Config{Policy: *p.SEVSNP, Collateral: cfg.Collateral.SNP, Now: cfg.Now, Logger: cfg.Logger})
		if err != nil {
			return nil, err
		}
		return gcp.NewSEVSNPValidator(cfg.gcp(tv))
	case p.TDX != nil:
		tv, err := tdx.NewVerifier(tdx.Config{Policy: *p.TDX, Collateral: cfg.Collateral.TDX, Now: cfg.Now, Logger: cfg.Logger})
		if err != nil {
			return nil, err
		}
		return gcp.NewTDXValidator(cfg.gcp(tv))
	}
	return qemu.NewValidator(qemu.ValidatorConfig{
		Measurements: p.PCRs,
		PlatformCAs:  cfg.PlatformCAs,
		TrustAnyAK:   cfg.TrustAnyAK,
		NonZero:      cfg.NonZero,
		Logger:       cfg.Logger,
	})
}

func (cfg Config) gcp(tv vtpm.TEEVerifier) gcp.ValidatorConfig {
	c := gcp.ValidatorConfig{
		Measurements: cfg.Policy.PCRs,
		NonZero:      cfg.NonZero,
		TEE:          tv,
		Logger:       cfg.Logger,
	}
	if cfg.PlatformCAs != nil {
		c.AKRoots, c.AKInstance = cfg.PlatformCAs, localInstance
	}
	return c
}

// localInstance reads the instance the local cloud named in an AK
// certificate; one from before it named instances names none.
func localInstance(cert *x509.Certificate) (attestation.Instance, error) {
	inst, err := platformca.InstanceOf(cert)
	if errors.Is(err, platformca.ErrNoInstance) {
		return attestation.Instance{}, nil
	}
	return inst, err
}

// ErrTrustAnyAKWithHardware refuses TrustAnyAK for a hardware variant.
var ErrTrustAnyAKWithHardware = errors.New("TrustAnyAK is for the qemu-vtpm variant only")
