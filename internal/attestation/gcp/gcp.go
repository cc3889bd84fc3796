// Package gcp is the attestation variants of Google Cloud's Confidential
// VMs: a vTPM attestation (go-tpm-tools' Attestation, quoted by the AK
// Google provisions at GCE's NV indexes and certifies under its EK/AK
// CA) that also carries the VM's hardware evidence, an SEV-SNP report
// (variant gcp-sev-snp) or a TD quote (gcp-tdx), whose report data is
// tee.ReportData of the session. This is the form `gotpm attest
// --tee-technology` produces on GCP; see the attestation README for why
// Orrery starts with it.
//
// The local cloud plays gcp-sev-snp byte for byte, with its own platform
// CA in place of Google's and a simulated AMD chip (snp/snpsim) under a
// test root in place of AMD's: only an owner whose policy names that test
// root accepts it.
package gcp

import (
	"crypto/x509"
	"fmt"
	"log/slog"

	"github.com/google/go-tpm-tools/client"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
	"github.com/orrery-dev/orrery/internal/tpm/tpmdev"
)

// IssuerConfig configures an issuer on a node.
type IssuerConfig struct {
	// OpenTPM opens the vTPM. Required.
	OpenTPM tpmdev.Opener
	// FirmwareEventLogPath, normally vtpm.DefaultFirmwareEventLogPath.
	FirmwareEventLogPath string
	// MeasurementLog is Orrery's userspace measurement log.
	MeasurementLog *pcrlog.Log
	// Logger is told of slow attestations (vtpm.IssuerConfig.Logger).
	Logger *slog.Logger
	// OpenTEE opens the hardware attestation device. Nil means the
	// kernel's (SEV-SNP: /dev/sev-guest or configfs-tsm; TDX: likewise),
	// through go-sev-guest's and go-tdx-guest's quote providers.
	OpenTEE func() (client.TEEDevice, error)
}

// NewSEVSNPIssuer returns the gcp-sev-snp issuer.
func NewSEVSNPIssuer(cfg IssuerConfig) (*vtpm.Issuer, error) {
	open := cfg.OpenTEE
	if open == nil {
		open = client.CreateSevSnpQuoteProvider
	}
	return newIssuer(variant.GCPSEVSNP, cfg, open)
}

// NewTDXIssuer returns the gcp-tdx issuer.
func NewTDXIssuer(cfg IssuerConfig) (*vtpm.Issuer, error) {
	open := cfg.OpenTEE
	if open == nil {
		open = func() (client.TEEDevice, error) { return client.CreateTdxQuoteProvider() }
	}
	return newIssuer(variant.GCPTDX, cfg, open)
}

func newIssuer(v variant.Variant, cfg IssuerConfig, open func() (client.TEEDevice, error)) (*vtpm.Issuer, error) {
	return vtpm.NewIssuer(vtpm.IssuerConfig{
		Variant: v,
		OpenTPM: cfg.OpenTPM,
		// The AK GCE provisions: its ECC template and certificate at
		// GCE's NV indexes (the local cloud writes the same).
		LoadAK:               (&vtpm.NVAK{TemplateIndex: client.GceAKTemplateNVIndexECC, CertIndex: client.GceAKCertNVIndexECC}).Load,
		FirmwareEventLogPath: cfg.FirmwareEventLogPath,
		MeasurementLog:       cfg.MeasurementLog,
		OpenTEE:              open,
		Logger:               cfg.Logger,
	})
}

// ValidatorConfig configures a validator.
type ValidatorConfig struct {
	// Measurements are the expected PCR values. Required.
	Measurements measurements.M
	// AKRoots certify the vTPM's AK. Nil means Google's EK/AK roots
	// (with Google's intermediates), as go-tpm-tools embeds them.
	AKRoots []*x509.Certificate
	// AKInstance reads the VM an AK certificate names. Nil means GCE's
	// instance extension (GCEInstance).
	AKInstance func(*x509.Certificate) (attestation.Instance, error)
	// NonZero lists PCRs that must not be zero (see vtpm).
	NonZero []uint32
	// TEE verifies the hardware evidence: an *snp.Verifier for
	// gcp-sev-snp, a *tdx.Verifier for gcp-tdx. Required.
	TEE vtpm.TEEVerifier
	// Logger receives warnings; nil discards them.
	Logger *slog.Logger
}

// NewSEVSNPValidator returns the gcp-sev-snp validator.
func NewSEVSNPValidator(cfg ValidatorConfig) (*vtpm.Validator, error) {
	return newValidator(variant.GCPSEVSNP, cfg)
}

// NewTDXValidator returns the gcp-tdx validator.
func NewTDXValidator(cfg ValidatorConfig) (*vtpm.Validator, error) {
	return newValidator(variant.GCPTDX, cfg)
}

func newValidator(v variant.Variant, cfg ValidatorConfig) (*vtpm.Validator, error) {
	if cfg.TEE == nil {
		return nil, fmt.Errorf("%s validator: no hardware evidence verifier given; without one the variant would trust the cloud's vTPM alone", v)
	}
	vc := vtpm.ValidatorConfig{
		Variant:      v,
		Measurements: cfg.Measurements,
		AKRoots:      cfg.AKRoots,
		NonZero:      cfg.NonZero,
		Logger:       cfg.Logger,
		AKInstance:   cfg.AKInstance,
		TEE:          cfg.TEE,
	}
	if vc.AKRoots == nil {
		vc.AKRoots, vc.AKIntermediates = googleRoots, googleIntermediates
	}
	if vc.AKInstance == nil {
		vc.AKInstance = GCEInstance
	}
	return vtpm.NewValidator(vc)
}
