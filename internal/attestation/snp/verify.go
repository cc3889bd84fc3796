// Package snp verifies AMD SEV-SNP attestation reports in the form Google
// Cloud's Confidential VMs attach them to a vTPM attestation (see the
// attestation README for why this form): go-tpm-tools' Attestation
// carries a go-sev-guest Attestation, the report and the certificate
// chain of the key that signed it (VCEK or VLEK), and the report's
// REPORT_DATA is tee.ReportData of the session.
//
// go-sev-guest does the cryptography: package verify checks the report's
// signature and its key's certificate chain to AMD's ARK (or to a test
// root the owner named), and the ASK's revocation; package validate
// checks the report's fields against the owner's Policy. Nothing here
// parses a report or a certificate chain by hand.
//
// Verification never uses the network. The VCEK (or VLEK) certificate
// travels with the evidence; AMD's ARK and ASK are the ones go-sev-guest
// embeds; CRLs and any certificate the evidence lacks come from a
// Collateral cache the owner fills (see Collateral) and keeps fresh: a
// product CRL past its nextUpdate is refused (go-sev-guest would use
// it), since a key AMD revoked after it was issued would pass.
package snp

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"time"

	"github.com/google/go-sev-guest/abi"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/go-sev-guest/validate"
	"github.com/google/go-sev-guest/verify"
	"github.com/google/go-sev-guest/verify/trust"
	attestpb "github.com/google/go-tpm-tools/proto/attest"
	"google.golang.org/protobuf/proto"

	"github.com/orrery-dev/orrery/internal/attestation/gcp/launchendorsement"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// Config configures a Verifier.
type Config struct {
	// Policy is the owner's SEV-SNP policy. Required.
	Policy Policy
	// Collateral serves CRLs and certificates the evidence lacks. Nil
	// is an empty cache.
	Collateral Collateral
	// SkipRevocationCheck verifies without a CRL. Only for evidence
	// whose CRL the owner cannot have (the real reports in this
	// package's tests); a verifier that skips logs a warning each time.
	SkipRevocationCheck bool
	// Now is the clock for certificate validity and for the CRL's
	// nextUpdate; nil means time.Now.
	Now func() time.Time
	// Logger receives warn-only mismatches; nil discards them.
	Logger *slog.Logger
}

// Verifier checks SEV-SNP evidence against one policy.
type Verifier struct {
	cfg      Config
	roots    map[string][]*trust.AMDRootCerts
	testRoot bool
	// own is what the policy itself brings: a test root's CRL, by the
	// URL its ASK names. It is consulted before Config.Collateral.
	own CollateralMap
	log *slog.Logger
}

// NewVerifier returns a verifier, or an error if the policy is invalid.
func NewVerifier(cfg Config) (*Verifier, error) {
	if err := cfg.Policy.Validate(); err != nil {
		return nil, err
	}
	v := &Verifier{cfg: cfg, log: cfg.Logger}
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	if v.cfg.Now == nil {
		v.cfg.Now = time.Now
	}
	var err error
	if tr := cfg.Policy.TestRoot; tr != nil {
		v.roots, v.own, err = testRoots(*tr)
		v.testRoot = true
	} else {
		v.roots, err = amdRoots()
	}
	if err != nil {
		return nil, err
	}
	return v, nil
}

// amdRoots are AMD's ARK, ASK and ASVK per product line, as go-sev-guest
// embeds them. Fresh objects per verifier: go-sev-guest caches a CRL in
// them.
func amdRoots() (map[string][]*trust.AMDRootCerts, error) {
	bundles := map[string][2][]byte{
		"Milan": {trust.AskArkMilanVcekBytes, trust.AskArkMilanVlekBytes},
		"Genoa": {trust.AskArkGenoaVcekBytes, trust.AskArkGenoaVlekBytes},
		"Turin": {trust.AskArkTurinVcekBytes, trust.AskArkTurinVlekBytes},
	}
	out := map[string][]*trust.AMDRootCerts{}
	for line, b := range bundles {
		r := trust.AMDRootCertsProduct(line)
		r.ProductCerts = &trust.ProductCerts{}
		if err := r.ProductCerts.FromKDSCertBytes(b[0]); err != nil {
			return nil, fmt.Errorf("AMD %s VCEK roots: %w", line, err)
		}
		// go-sev-guest v0.14.0's Turin VLEK bundle has trailing bytes
		// and does not parse: Turin VLEK reports then find no ASVK and
		// are refused, which is the safe side.
		var vlek trust.ProductCerts
		if err := vlek.FromKDSCertBytes(b[1]); err == nil {
			r.ProductCerts.Asvk = vlek.Asvk
		}
		out[line] = []*trust.AMDRootCerts{r}
	}
	return out, nil
}

// testRoots trusts a test ARK and ASK for every product line, and
// serves the root's own CRL for the URL its ASK names.
func testRoots(tr TestRoot) (map[string][]*trust.AMDRootCerts, CollateralMap, error) {
	c, err := tr.certificates()
	if err != nil {
		return nil, nil, err
	}
	own := CollateralMap{}
	if len(c.crl) > 0 {
		for _, url := range c.ask.CRLDistributionPoints {
			own[url] = c.crl
		}
	}

	out := map[string][]*trust.AMDRootCerts{}
	for _, line := range []string{"Milan", "Genoa", "Turin"} {
		r := trust.AMDRootCertsProduct(line)
		r.ProductCerts = &trust.ProductCerts{Ark: c.ark, Ask: c.ask}
		out[line] = []*trust.AMDRootCerts{r}
	}
	return out, own, nil
}

// VerifyTEE checks the SEV-SNP evidence in a vTPM attestation (see
// VerifyReport).
func (v *Verifier) VerifyTEE(ctx context.Context, att *attestpb.Attestation, reportData []byte) ([]tee.Field, error) {
	snp := att.GetSevSnpAttestation()
	if snp == nil {
		return nil, errors.New("the attestation carries no SEV-SNP report: the node is not an SEV-SNP confidential VM, or its platform did not attach the report")
	}
	return v.VerifyReport(ctx, snp, reportData)
}

// VerifyReport checks, in this order, that the report is signed by a key
// whose certificate chains to the trusted roots, is valid now and not
// revoked by its product's CRL (a CRL past its nextUpdate is refused
// with ErrCollateralExpired; Config.SkipRevocationCheck skips both);
// that its REPORT_DATA is reportData; that it is not a debug
// guest; and that its fields meet the policy (enforced checks reject
// with a *tee.Mismatch, warn-only ones are logged). It returns the
// report's fields for display.
func (v *Verifier) VerifyReport(ctx context.Context, evidence *spb.Attestation, reportData []byte) ([]tee.Field, error) {
	if evidence.GetReport() == nil {
		return nil, errors.New("SEV-SNP evidence has no report")
	}
	if len(reportData) != abi.ReportDataSize {
		return nil, fmt.Errorf("expected report data has %d bytes, not %d", len(reportData), abi.ReportDataSize)
	}
	// go-sev-guest fills in what the chain lacks: work on a copy.
	att := proto.Clone(evidence).(*spb.Attestation)
	if att.CertificateChain == nil {
		att.CertificateChain = &spb.CertificateChain{}
	}
	root, err := v.verifySignature(ctx, att)
	if err != nil {
		return nil, err
	}
	report := att.GetReport()
	base := v.baseOptions(reportData)
	if err := validate.SnpAttestation(att, base); err != nil {
		return nil, v.explainBase(report, reportData, err)
	}
	var launch []tee.Field
	if p := v.cfg.Policy.GCELaunchEndorsement; p != nil {
		l, err := v.checkEndorsedLaunch(att, *p)
		if err != nil {
			return nil, err
		}
		launch = append(launch, tee.Field{Name: "launch endorsement", Value: l.Describe()})
	}
	if err := v.checkPolicy(att, base); err != nil {
		return nil, err
	}
	return append(fields(att, root, v.testRoot), launch...), nil
}

// checkEndorsedLaunch checks that Google endorsed the report's launch
// measurement. The endorsement comes from the host, in the extended
// report's certificate table, as GCE attaches it, or from the owner's
// collateral cache at the URL Google publishes it under: tried when the
// host attached none or one that does not verify (Google posts amended
// endorsements there). Its origin does not matter: each is verified
// under the owner's roots, and a host that attaches another firmware's
// endorsement only gets the report refused, since the AMD-signed
// measurement must be listed in one signed under those roots.
func (v *Verifier) checkEndorsedLaunch(att *spb.Attestation, p launchendorsement.Policy) (launchendorsement.SNPLaunch, error) {
	m := att.GetReport().GetMeasurement()
	now := v.cfg.Now()
	var attachedErr error
	if blob := att.GetCertificateChain().GetExtras()[launchendorsement.SNPCertTableGUID]; len(blob) > 0 {
		l, err := p.CheckSNP(blob, m, now)
		if err == nil {
			return l, nil
		}
		attachedErr = fmt.Errorf("the launch endorsement the host attached: %w", err)
	}
	url := launchendorsement.SNPURL(m)
	blob, err := v.endorsementFromCache(url)
	if err == nil {
		var l launchendorsement.SNPLaunch
		if l, err = p.CheckSNP(blob, m, now); err == nil {
			return l, nil
		}
		err = fmt.Errorf("the launch endorsement in the collateral cache: %w", err)
	}
	if attachedErr == nil {
		attachedErr = errors.New("the host attached no launch endorsement of its firmware")
	}
	return launchendorsement.SNPLaunch{}, fmt.Errorf("SEV-SNP report refused: %w", errors.Join(attachedErr, err))
}

// endorsementFromCache reads Google's launch endorsement at url from the
// collateral cache.
func (v *Verifier) endorsementFromCache(url string) ([]byte, error) {
	blob, err := []byte(nil), error(fs.ErrNotExist)
	if v.cfg.Collateral != nil {
		blob, err = v.cfg.Collateral.Get(url)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("the collateral cache holds none (%s)", fetchEndorsementHint(v.cfg.Collateral, url))
	}
	if err != nil {
		return nil, fmt.Errorf("the collateral cache's launch endorsement: %w", err)
	}
	return blob, nil
}

// verifySignature runs go-sev-guest's verification offline and returns
// a description of the root the chain ends in.
func (v *Verifier) verifySignature(ctx context.Context, att *spb.Attestation) (string, error) {
	now := v.cfg.Now()
	getter := &offlineGetter{own: v.own, cache: v.cfg.Collateral, roots: v.roots, now: now}
	opts := &verify.Options{
		// The evidence's own VCEK or VLEK certificate is used when it
		// has one; the ARK and ASK are the trusted roots either way.
		DisableCertFetching: hasEndorsementKeyCert(att),
		CheckRevocations:    !v.cfg.SkipRevocationCheck,
		Getter:              getter,
		Now:                 now,
		TrustedRoots:        v.roots,
	}
	if v.cfg.SkipRevocationCheck {
		v.log.Warn("SEV-SNP revocation check skipped: a revoked AMD signing key would pass")
	}
	if err := verify.SnpAttestationContext(ctx, att, opts); err != nil {
		if getter.expired != nil {
			return "", fmt.Errorf("SEV-SNP report refused: %w", getter.expired)
		}
		err = explainVerify(err, now)
		if !v.testRoot && strings.Contains(err.Error(), "could not be verified by any trusted roots") {
			err = fmt.Errorf("%w; the local cloud's simulated SEV-SNP VMs sign under a test root, which is accepted only where the owner names it (--snp-test-root orrery-mini/snp-test-root.json)", err)
		}
		return "", err
	}
	if !v.cfg.SkipRevocationCheck {
		if err := v.checkEndorsementKeyNotRevoked(att); err != nil {
			return "", err
		}
	}
	if v.testRoot {
		return "test root named by the owner: NOT A REAL CPU", nil
	}
	return "AMD ARK", nil
}

// checkEndorsementKeyNotRevoked refuses a VCEK or VLEK whose serial the
// product's CRL lists. go-sev-guest checks only the ASK against the CRL
// (AMD retires VCEKs through TCB versions rather than revoking them);
// the CRL it fetched and checked against the ARK is reused here, so a
// key revoked anyway is refused too.
func (v *Verifier) checkEndorsementKeyNotRevoked(att *spb.Attestation) error {
	ek, err := endorsementKeyCert(att)
	if err != nil {
		return err
	}
	for _, roots := range v.roots {
		for _, r := range roots {
			r.Mu.Lock()
			crl := r.CRL
			r.Mu.Unlock()
			if crl == nil || crl.CheckSignatureFrom(r.ProductCerts.Ark) != nil {
				continue
			}
			for _, bad := range crl.RevokedCertificateEntries {
				if bad.SerialNumber.Cmp(ek.SerialNumber) == 0 {
					return fmt.Errorf("the SEV-SNP report's signing key certificate (serial %s) was revoked by AMD on %s: the CPU's firmware key is no longer trusted", ek.SerialNumber, bad.RevocationTime.UTC().Format(time.DateOnly))
				}
			}
		}
	}
	return nil
}

func hasEndorsementKeyCert(att *spb.Attestation) bool {
	c := att.GetCertificateChain()
	return len(c.GetVcekCert()) > 0 || len(c.GetVlekCert()) > 0
}

func endorsementKeyCert(att *spb.Attestation) (*x509.Certificate, error) {
	info, err := abi.ParseSignerInfo(att.GetReport().GetSignerInfo())
	if err != nil {
		return nil, fmt.Errorf("SEV-SNP report signer info: %w", err)
	}
	der := att.GetCertificateChain().GetVcekCert()
	if info.SigningKey == abi.VlekReportSigner {
		der = att.GetCertificateChain().GetVlekCert()
	}
	return x509.ParseCertificate(der)
}

// baseOptions are the checks every report must pass, whatever the
// policy: the session's report data, a guest at VMPL 0 (the VM's own
// kernel, not a lower privilege level under a paravisor), no debug, and
// a reported TCB that the signing key's certificate certifies. Firmware
// loaded newer than the committed version (provisional firmware, as
// after a live microcode update) is accepted: the reported TCB, which
// the policy's minimum checks, stays the lower committed one.
func (v *Verifier) baseOptions(reportData []byte) *validate.Options {
	vmpl := 0
	return &validate.Options{
		GuestPolicy: abi.SnpPolicy{SMT: true, MigrateMA: true},
		ReportData:  reportData,
		VMPL:        &vmpl,

		PermitProvisionalFirmware: true,
	}
}

// explainBase turns a failure of the base checks into an error that says
// which one failed, in words an owner can act on.
func (v *Verifier) explainBase(report *spb.Report, reportData []byte, err error) error {
	if pol, perr := abi.ParseSnpPolicy(report.GetPolicy()); perr == nil && pol.Debug {
		return &tee.Mismatch{Field: "guest policy debug", Seen: "allowed", Wanted: "not allowed (the host can read and change a debug guest's memory)"}
	}
	if hex.EncodeToString(report.GetReportData()) != hex.EncodeToString(reportData) {
		return errors.New("the SEV-SNP report's REPORT_DATA does not bind this session's nonce and TLS key: the report was replayed, relayed or made for another connection")
	}
	if report.GetVmpl() != 0 {
		return &tee.Mismatch{Field: "VMPL", Seen: fmt.Sprint(report.GetVmpl()), Wanted: "0 (a report from a less privileged level does not speak for the guest kernel)"}
	}
	return fmt.Errorf("SEV-SNP report refused: %w", err)
}

// explainVerify adds what to do to go-sev-guest's verification errors.
func explainVerify(err error, now time.Time) error {
	var crlErr verify.CRLUnavailableErr
	if errors.As(err, &crlErr) {
		return fmt.Errorf("SEV-SNP report: no usable CRL for its AMD product line in the collateral cache (put the product's CRL from https://kdsintf.amd.com/vcek/v1/<product>/crl there): %w", err)
	}
	return fmt.Errorf("SEV-SNP report does not verify at %s (signature, or the signing key's certificate chain to the trusted AMD root, validity or revocation): %w", now.UTC().Format(time.RFC3339), err)
}
