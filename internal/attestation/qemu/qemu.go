// Package qemu is the attestation variant for QEMU VMs with an swtpm vTPM.
//
// The local cloud (the QEMU harness) plays the role a cloud provider plays
// for its vTPMs: before a VM's first boot it creates an attestation key in
// the vTPM's endorsement hierarchy, certifies it with its platform CA and
// publishes the key's template and certificate in TPM NV at the indexes
// Google Compute Engine uses for the same purpose (see package platformca).
// The issuer recreates the key from that template; the validator trusts
// exactly the keys the platform CA certified.
package qemu

import (
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"

	"github.com/google/go-tpm-tools/client"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/measurelog"
)

// NV indexes where the platform publishes the attestation key.
const (
	AKTemplateNVIndex = client.GceAKTemplateNVIndexECC
	AKCertNVIndex     = client.GceAKCertNVIndexECC
)

// IssuerConfig configures NewIssuer. Zero values of the paths mean "no log".
type IssuerConfig struct {
	// OpenTPM opens the vTPM (on a node: /dev/tpmrm0). Required.
	OpenTPM func() (io.ReadWriteCloser, error)
	// FirmwareEventLogPath, normally vtpm.DefaultFirmwareEventLogPath.
	FirmwareEventLogPath string
	// MeasurementLog, normally at measurelog.DefaultPath.
	MeasurementLog *measurelog.Log
}

// NewIssuer returns the QEMU vTPM issuer.
func NewIssuer(cfg IssuerConfig) (*vtpm.Issuer, error) {
	return vtpm.NewIssuer(vtpm.IssuerConfig{
		Variant:              variant.QEMUVTPM,
		OpenTPM:              cfg.OpenTPM,
		LoadAK:               LoadAK,
		FirmwareEventLogPath: cfg.FirmwareEventLogPath,
		MeasurementLog:       cfg.MeasurementLog,
	})
}

// LoadAK recreates the platform-provisioned attestation key and loads its
// certificate from NV.
func LoadAK(rw io.ReadWriter) (*client.Key, error) {
	ak, err := client.GceAttestationKeyECC(rw)
	if err != nil {
		return nil, fmt.Errorf("load the platform's attestation key (NV index %#x; was this vTPM provisioned by the local cloud?): %w", AKTemplateNVIndex, err)
	}
	return ak, nil
}

// ValidatorConfig configures NewValidator.
type ValidatorConfig struct {
	// Measurements are the expected PCR values. Required.
	Measurements measurements.M
	// PlatformCAs certify attestation keys. Required unless TrustAnyAK.
	PlatformCAs []*x509.Certificate
	// TrustAnyAK skips the attestation key check: development only.
	TrustAnyAK bool
	// NonZero lists PCRs that must not be zero (see
	// vtpm.ValidatorConfig.NonZero). Empty checks none.
	NonZero []uint32
	// Logger receives warnings; nil discards them.
	Logger *slog.Logger
}

// NewValidator returns the QEMU vTPM validator.
func NewValidator(cfg ValidatorConfig) (*vtpm.Validator, error) {
	return vtpm.NewValidator(vtpm.ValidatorConfig{
		Variant:      variant.QEMUVTPM,
		Measurements: cfg.Measurements,
		AKRoots:      cfg.PlatformCAs,
		TrustAnyAK:   cfg.TrustAnyAK,
		NonZero:      cfg.NonZero,
		Logger:       cfg.Logger,
	})
}
