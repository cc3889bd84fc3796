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
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
	"github.com/orrery-dev/orrery/internal/tpm/tpmdev"
)

// NV indexes where the platform publishes the attestation key.
const (
	AKTemplateNVIndex = client.GceAKTemplateNVIndexECC
	AKCertNVIndex     = client.GceAKCertNVIndexECC
)

// IssuerConfig configures NewIssuer. Zero values of the paths mean "no log".
type IssuerConfig struct {
	// OpenTPM opens the vTPM (on a node: /dev/tpmrm0). Required.
	OpenTPM tpmdev.Opener
	// FirmwareEventLogPath, normally vtpm.DefaultFirmwareEventLogPath.
	FirmwareEventLogPath string
	// MeasurementLog, normally at pcrlog.DefaultPath.
	MeasurementLog *pcrlog.Log
	// Logger is told of slow attestations (vtpm.IssuerConfig.Logger).
	Logger *slog.Logger
}

// NodeIssuerConfig is the issuer configuration of a booted node: its vTPM
// (tpmdev.Open), the kernel's copy of the firmware's event log, and
// Orrery's userspace measurement log. bootstrapperd attests with it, and
// so does the join service, which quotes on its control-plane node's vTPM
// (its pod mounts those paths); either may point a path elsewhere.
func NodeIssuerConfig() IssuerConfig {
	return IssuerConfig{
		OpenTPM:              tpmdev.Open,
		FirmwareEventLogPath: vtpm.DefaultFirmwareEventLogPath,
		MeasurementLog:       &pcrlog.Log{Path: pcrlog.DefaultPath},
	}
}

// NewIssuer returns the QEMU vTPM issuer.
func NewIssuer(cfg IssuerConfig) (*vtpm.Issuer, error) {
	return vtpm.NewIssuer(vtpm.IssuerConfig{
		Variant:              variant.QEMUVTPM,
		OpenTPM:              cfg.OpenTPM,
		LoadAK:               loadAKWith(newNVAK()),
		FirmwareEventLogPath: cfg.FirmwareEventLogPath,
		MeasurementLog:       cfg.MeasurementLog,
		Logger:               cfg.Logger,
	})
}

// LoadAK recreates the platform-provisioned attestation key and loads its
// certificate from NV.
func LoadAK(rw io.ReadWriter) (*client.Key, error) {
	return loadAKWith(newNVAK())(rw)
}

func newNVAK() *vtpm.NVAK {
	return &vtpm.NVAK{TemplateIndex: AKTemplateNVIndex, CertIndex: AKCertNVIndex}
}

// loadAKWith loads the AK through ak, which an issuer keeps, so that it
// reads the AK's template and certificate from NV once.
func loadAKWith(ak *vtpm.NVAK) func(io.ReadWriter) (*client.Key, error) {
	return func(rw io.ReadWriter) (*client.Key, error) {
		k, err := ak.Load(rw)
		if err != nil {
			return nil, fmt.Errorf("load the platform's attestation key (NV index %#x; was this vTPM provisioned by the local cloud?): %w", AKTemplateNVIndex, err)
		}
		return k, nil
	}
}

// ReadPlatformCA returns the platform CA that certified this vTPM's own
// attestation key, as the platform published it in NV
// (platformca.CACertNVIndex). A node uses it to verify another node of the
// same platform: the joining node checks the join service's attestation
// key against it.
//
// It is a trust anchor only as far as the NV is: the platform (the local
// cloud, which certifies every AK anyway) writes it before the first boot,
// and nobody on the network can change it; a process with root on this
// node could, but such a process owns the node's secrets already. The CA
// must have signed this vTPM's own AK certificate, so a certificate that
// is not the one behind this node's AK is refused. Real clouds' vTPM
// roots are public and fixed, and would come with the image instead.
func ReadPlatformCA(rw io.ReadWriter) (*x509.Certificate, error) {
	caDER, err := tpm2.NVReadEx(rw, tpmutil.Handle(platformca.CACertNVIndex), tpm2.HandleOwner, "", 0)
	if err != nil {
		return nil, fmt.Errorf("read the platform CA certificate from NV index %#x (was this vTPM provisioned by a local cloud that publishes it? VMs created by an older 'orrery mini' lack it: recreate them): %w", platformca.CACertNVIndex, err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("parse the platform CA certificate in NV index %#x: %w", platformca.CACertNVIndex, err)
	}
	if !ca.IsCA {
		return nil, fmt.Errorf("the certificate in NV index %#x is not a CA certificate", platformca.CACertNVIndex)
	}
	akDER, err := tpm2.NVReadEx(rw, tpmutil.Handle(AKCertNVIndex), tpm2.HandleOwner, "", 0)
	if err != nil {
		return nil, fmt.Errorf("read this vTPM's attestation key certificate from NV index %#x: %w", AKCertNVIndex, err)
	}
	ak, err := x509.ParseCertificate(akDER)
	if err != nil {
		return nil, fmt.Errorf("parse this vTPM's attestation key certificate: %w", err)
	}
	if err := ak.CheckSignatureFrom(ca); err != nil {
		return nil, fmt.Errorf("the platform CA certificate in NV index %#x did not sign this vTPM's attestation key certificate; refusing it as a trust anchor: %w", platformca.CACertNVIndex, err)
	}
	return ca, nil
}

// OwnPlatformCAs opens this node's TPM and returns, as the trust list a
// node checks its peers' attestation keys against, the platform CA that
// certified its own (ReadPlatformCA).
func OwnPlatformCAs(open tpmdev.Opener) ([]*x509.Certificate, error) {
	rw, err := open()
	if err != nil {
		return nil, fmt.Errorf("open TPM: %w", err)
	}
	defer rw.Close()
	ca, err := ReadPlatformCA(rw)
	if err != nil {
		return nil, err
	}
	return []*x509.Certificate{ca}, nil
}

// ReadInstance returns the instance the platform named in this vTPM's own
// AK certificate (see platformca.InstanceOf): which VM this is, as
// verifiers will see it. A vTPM provisioned before AK certificates named
// instances gives the zero Instance. The certificate is not verified: it
// is this node's own, as far as its NV is (see ReadPlatformCA).
func ReadInstance(rw io.ReadWriter) (attestation.Instance, error) {
	akDER, err := tpm2.NVReadEx(rw, tpmutil.Handle(AKCertNVIndex), tpm2.HandleOwner, "", 0)
	if err != nil {
		return attestation.Instance{}, fmt.Errorf("read this vTPM's attestation key certificate from NV index %#x: %w", AKCertNVIndex, err)
	}
	cert, err := x509.ParseCertificate(akDER)
	if err != nil {
		return attestation.Instance{}, fmt.Errorf("parse this vTPM's attestation key certificate: %w", err)
	}
	return akInstance(cert)
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
		AKInstance:   akInstance,
	})
}

// akInstance reads the instance the local cloud named in an AK
// certificate. A certificate from before instance identities names none:
// verifiers that do not ask who attested (the CLI, the joining node) keep
// accepting such VMs, and the join service, which does ask, refuses them.
func akInstance(cert *x509.Certificate) (attestation.Instance, error) {
	inst, err := platformca.InstanceOf(cert)
	if errors.Is(err, platformca.ErrNoInstance) {
		return attestation.Instance{}, nil
	}
	return inst, err
}
