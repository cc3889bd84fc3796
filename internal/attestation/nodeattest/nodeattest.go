// Package nodeattest tells a node which attestation variant its platform
// offers and makes that variant's issuer: bootstrapperd, the initrd and
// the join service all attest through it, so a node attests one way
// wherever it does.
//
// The platform is:
//   - an SEV-SNP guest (the kernel's /dev/sev-guest): gcp-sev-snp, reports
//     from the hardware;
//   - a TDX guest (/dev/tdx_guest): gcp-tdx;
//   - a VM the local cloud's metadata names a simulated SEV-SNP VM, on an
//     image of the local flavour and where the kernel sees no
//     confidential guest: gcp-sev-snp, reports from the cloud's
//     simulated chip (package snpsim), under a test root;
//   - anything else: qemu-vtpm.
//
// What the node picks decides nothing: a verifier accepts only the
// variant its owner's measurements name, so a node that claims the wrong
// platform is refused, not trusted.
//
// A node holds its own peers (the join service) to its own platform's
// evidence too (Platform.PeerPolicy): an SEV-SNP or TDX node never takes
// a vTPM's word alone, since the host controls the vTPM.
package nodeattest

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/google/go-sev-guest/abi"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/go-tpm-tools/client"

	"github.com/orrery-dev/orrery/internal/attestation/gcp"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/snp"
	"github.com/orrery-dev/orrery/internal/attestation/tdx"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/metadata"
)

// Device paths of the kernel's confidential-guest drivers.
var (
	sevGuestDevice = "/dev/sev-guest"
	tdxGuestDevice = "/dev/tdx_guest"
)

// Platform is what this node's platform offers for attestation.
type Platform struct {
	Variant variant.Variant
	// Simulated is true on the local cloud's simulated SEV-SNP VMs.
	Simulated bool
	// report gets an extended SEV-SNP report (simulated platform only;
	// on hardware go-sev-guest asks the kernel).
	report func(data [abi.ReportDataSize]byte) ([]byte, error)
	// tdReport gets a TD report (tests only; on hardware go-tdx-guest's
	// device asks the kernel).
	tdReport func(data [tee.ReportDataSize]byte) ([]byte, error)
	// tdxRoots replace Intel's root for peers' TD quotes (tests only).
	tdxRoots *x509.CertPool
}

// Selfer is the part of the metadata client Detect needs.
type Selfer interface {
	Self(ctx context.Context) (metadata.Instance, error)
	SEVSNPReport(ctx context.Context, reportData [64]byte) ([]byte, error)
}

// Detect finds the platform: hardware first, then the local cloud's
// metadata, which is asked only when the kernel shows no confidential
// guest (and may be nil where there is no metadata service).
//
// It refuses (a *RefusedError, which asking again will not change):
//   - a VM on which the kernel runs as an SEV-SNP or TDX guest but the
//     guest device is missing: such a node attests with its hardware or
//     not at all, and never asks the host what it is;
//   - the metadata's simulated SEV-SNP on an image of the cloud flavour.
func Detect(ctx context.Context, meta Selfer) (Platform, error) {
	if exists(sevGuestDevice) {
		return Platform{Variant: variant.GCPSEVSNP}, nil
	}
	if exists(tdxGuestDevice) {
		return Platform{Variant: variant.GCPTDX}, nil
	}
	guest, err := readConfidentialGuest()
	if err != nil {
		return Platform{}, err
	}
	switch {
	case guest.SEVSNP:
		return Platform{}, &RefusedError{fmt.Sprintf("this VM is an SEV-SNP guest (%s), but %s is missing: the sev-guest driver did not start. "+
			"The node attests with its CPU's reports or not at all; the console's earlier lines say why the driver failed", guest.Evidence, sevGuestDevice)}
	case guest.TDX:
		return Platform{}, &RefusedError{fmt.Sprintf("this VM is a TDX guest (%s), but %s is missing: the tdx-guest driver did not start. "+
			"The node attests with its TD's quotes or not at all; the console's earlier lines say why the driver failed", guest.Evidence, tdxGuestDevice)}
	}
	if meta == nil {
		return Platform{Variant: variant.QEMUVTPM}, nil
	}
	self, err := meta.Self(ctx)
	if err != nil {
		return Platform{}, fmt.Errorf("ask the metadata service what this VM is: %w", err)
	}
	if self.TEE != metadata.TEESimulatedSEVSNP {
		return Platform{Variant: variant.QEMUVTPM}, nil
	}
	local, err := localFlavour()
	if err != nil {
		return Platform{}, err
	}
	if !local {
		return Platform{}, &RefusedError{"the metadata service says this VM is the local cloud's simulated SEV-SNP VM, " +
			"but this image is the cloud flavour, which takes no simulated reports and trusts no test root. " +
			"On the local cloud ('orrery mini'), boot the local flavour (build/image/disk.qcow2)"}
	}
	return Platform{Variant: variant.GCPSEVSNP, Simulated: true, report: func(d [abi.ReportDataSize]byte) ([]byte, error) {
		return meta.SEVSNPReport(context.WithoutCancel(ctx), d)
	}}, nil
}

// RefusedError is Detect refusing what the platform offers; asking again
// does not change the answer.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "refusing to attest: " + e.Reason }

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Issuer returns the platform's issuer over the node's vTPM and logs.
func (p Platform) Issuer(cfg qemu.IssuerConfig) (*vtpm.Issuer, error) {
	gc := gcp.IssuerConfig{OpenTPM: cfg.OpenTPM, FirmwareEventLogPath: cfg.FirmwareEventLogPath, MeasurementLog: cfg.MeasurementLog, Logger: cfg.Logger}
	switch p.Variant {
	case variant.GCPSEVSNP:
		if p.report != nil {
			gc.OpenTEE = func() (client.TEEDevice, error) {
				return &client.SevSnpQuoteProvider{QuoteProvider: snp.QuoteProvider{GetReport: p.report}}, nil
			}
		}
		return gcp.NewSEVSNPIssuer(gc)
	case variant.GCPTDX:
		return gcp.NewTDXIssuer(gc)
	}
	return qemu.NewIssuer(cfg)
}

// OwnReport is an SEV-SNP report of this node, for what it says of the
// node itself (its launch measurement, its signing chain); nil data.
func (p Platform) OwnReport() (*spb.Attestation, error) {
	if p.Variant != variant.GCPSEVSNP {
		return nil, fmt.Errorf("this node is a %s node, not an SEV-SNP one", p.Variant)
	}
	var raw []byte
	var err error
	var data [abi.ReportDataSize]byte
	if p.report != nil {
		raw, err = p.report(data)
	} else {
		raw, err = hardwareReport(data)
	}
	if err != nil {
		return nil, fmt.Errorf("get this node's own SEV-SNP report: %w", err)
	}
	return abi.ReportCertsToProto(raw)
}

// OwnTD is what this node's own TD report shows of its measurement
// registers; nil report data.
func (p Platform) OwnTD() (tdx.Measurements, error) {
	if p.Variant != variant.GCPTDX {
		return tdx.Measurements{}, fmt.Errorf("this node is a %s node, not a TDX one", p.Variant)
	}
	get := p.tdReport
	if get == nil {
		get = hardwareTDReport
	}
	raw, err := get([tee.ReportDataSize]byte{})
	if err != nil {
		return tdx.Measurements{}, fmt.Errorf("get this node's own TD report: %w", err)
	}
	return tdReportMeasurements(raw)
}

// PeerPolicy is what this node holds a peer of its own image and
// platform to (the join service it joins or rejoins through): that it
// attests as this node's variant, and that its hardware evidence shows
// what this node's own does.
//   - SEV-SNP: the launch measurement of this node's own report, under
//     AMD's roots, or, on the simulated platform, under the test root
//     its own report was signed under;
//   - TDX: the MRTD, RTMR1 and RTMR2 of this node's own TD report
//     (tdx.PeerPolicy says why those), under Intel's root;
//   - qemu-vtpm: no hardware evidence; the vTPM alone.
func (p Platform) PeerPolicy() (PeerPolicy, error) {
	switch p.Variant {
	case variant.QEMUVTPM:
		return PeerPolicy{Variant: p.Variant}, nil
	case variant.GCPSEVSNP:
		pol, err := p.peerSEVSNP()
		if err != nil {
			return PeerPolicy{}, fmt.Errorf("what a peer's SEV-SNP report must show: %w", err)
		}
		return PeerPolicy{Variant: p.Variant, SEVSNP: pol}, nil
	case variant.GCPTDX:
		own, err := p.OwnTD()
		if err != nil {
			return PeerPolicy{}, fmt.Errorf("what a peer's TD quote must show: %w", err)
		}
		pol := tdx.PeerPolicy(own)
		if err := pol.Validate(); err != nil {
			return PeerPolicy{}, fmt.Errorf("what a peer's TD quote must show: %w", err)
		}
		return PeerPolicy{Variant: p.Variant, TDX: &pol, TDXRoots: p.tdxRoots}, nil
	}
	return PeerPolicy{}, fmt.Errorf("no peer policy for a %s node", p.Variant)
}

// peerSEVSNP is the SEV-SNP policy this node holds a peer of its own
// image and platform to: the launch measurement of its own report and,
// on the simulated platform, the test root its own report was signed
// under. A real platform's peers are held to AMD's roots.
func (p Platform) peerSEVSNP() (*snp.Policy, error) {
	own, err := p.OwnReport()
	if err != nil {
		return nil, err
	}
	pol := &snp.Policy{Measurement: &tee.Expected{Expected: own.GetReport().GetMeasurement()}}
	if p.Simulated {
		chain := own.GetCertificateChain()
		pol.TestRoot = &snp.TestRoot{NotARealCPU: true, ARK: pemCert(chain.GetArkCert()), ASK: pemCert(chain.GetAskCert())}
	}
	return pol, pol.Validate()
}

// DetectUntil is Detect, asked again every 2 s until it answers, refuses
// or ctx ends: right after boot the metadata service may not answer yet, and
// attesting as another variant would only be refused. say hears of the
// first failure and of every fifteenth.
func DetectUntil(ctx context.Context, meta Selfer, say func(attempt int, err error)) (Platform, error) {
	for attempt := 1; ; attempt++ {
		p, err := Detect(ctx, meta)
		if err == nil {
			return p, nil
		}
		if refused := (*RefusedError)(nil); errors.As(err, &refused) {
			return Platform{}, err
		}
		if attempt == 1 || attempt%15 == 0 {
			say(attempt, err)
		}
		select {
		case <-ctx.Done():
			return Platform{}, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}
