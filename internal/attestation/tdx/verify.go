package tdx

import (
	"context"
	"crypto/x509"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/go-tdx-guest/abi"
	"github.com/google/go-tdx-guest/pcs"
	tdxpb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/google/go-tdx-guest/verify"
	attestpb "github.com/google/go-tpm-tools/proto/attest"

	"github.com/orrery-dev/orrery/internal/attestation/gcp/launchendorsement"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// intelRootPEM is Intel's SGX Root CA certificate, the same bytes as
// go-tdx-guest's verify/trusted_root.pem. go-tdx-guest falls back to
// that copy when given no roots, but then prints a warning on stdout at
// every verification; passing it ourselves keeps stdout clean.
//
//go:embed intel_sgx_root_ca.pem
var intelRootPEM []byte

// Errors a caller may tell apart (with errors.Is). Each message says
// what the owner can do.
var (
	ErrNoEvidence          = errors.New("the attestation carries no TDX quote: the node is not a TDX confidential VM, or its platform did not attach the quote")
	ErrSignature           = errors.New("a signature over the TDX quote or its certificate chain does not verify: the quote was altered or forged")
	ErrUntrustedRoot       = errors.New("the TDX quote's certificate chain does not end in a trusted root (Intel's SGX Root CA unless configured otherwise): it was not made by a genuine Intel platform")
	ErrCertificateExpired  = errors.New("a certificate of the TDX quote's chain is expired or not yet valid: check this machine's clock; an expired PCK certificate must be renewed by the platform's owner")
	ErrRevoked             = errors.New("a certificate of the TDX quote's chain is revoked by Intel: the platform's keys are no longer trusted")
	ErrTCBNotUpToDate      = errors.New("out-of-date TCB: by Intel's TCB info the platform's TDX module, microcode or quoting enclave is not up to date: update the host (on a cloud, the provider does; recreating the VM may place it on an updated host)")
	ErrCollateralExpired   = errors.New("TDX collateral in the cache has expired (or this machine's clock is wrong): fetch fresh TCB info, QE identity and CRLs from Intel PCS into the cache")
	ErrCollateralInvalid   = errors.New("TDX collateral in the cache does not verify or does not fit this platform: fetch it again from Intel PCS")
	ErrNotBound            = errors.New("the TDX quote's REPORT_DATA does not bind this session's nonce and TLS key: the quote was replayed, relayed or made for another connection")
	ErrNotIntelEnclave     = errors.New("the TDX quote was not signed by Intel's TD quoting enclave, or not for a TDX module Intel signed: whoever runs an SGX platform can have its PCK key certify an enclave of its own, so the quote does not show a genuine TD")
	ErrQuoteFieldsRejected = errors.New("the TDX quote's XFAM or TD attributes have bits no TD may have")
)

// Config configures a Verifier.
type Config struct {
	// Policy is the owner's TDX policy. Required.
	Policy Policy
	// Collateral serves Intel's TCB info, QE identity and CRLs. Required
	// unless SkipCollateral: verification never falls back to the
	// network.
	Collateral Collateral
	// Now is the clock for certificate and collateral validity; nil
	// means time.Now.
	Now func() time.Time
	// TrustedRoots are the roots the PCK chain and the collateral's
	// signing chain must end in; nil means Intel's SGX Root CA.
	TrustedRoots *x509.CertPool
	// SkipRevocationCheck verifies without the PCK and root CA CRLs.
	// A revoked platform key would then pass; a verifier that skips
	// logs a warning each time.
	SkipRevocationCheck bool
	// SkipCollateral verifies without any of Intel's collateral, for a
	// verifier that has no cache: a node checking its join service (the
	// owner's commands and the join service have one). Neither
	// revocation nor the TCB status of the platform and of its quoting
	// enclave is checked then, so a revoked or out-of-date platform
	// passes; a verifier that skips logs a warning each time. What the
	// collateral would also state, that the quoting enclave and the TDX
	// module are Intel's, is checked against Intel's fixed identities
	// instead (see checkIntelIdentities). Collateral may then be nil.
	SkipCollateral bool
	// Logger receives warn-only mismatches; nil discards them.
	Logger *slog.Logger
}

// Verifier checks TDX evidence against one policy. It is safe for
// concurrent use if its Collateral is (CollateralDir and CollateralMap
// are).
type Verifier struct {
	cfg   Config
	roots *x509.CertPool
	log   *slog.Logger
}

// NewVerifier returns a verifier, or an error if the configuration is
// incomplete or the policy invalid.
func NewVerifier(cfg Config) (*Verifier, error) {
	if err := cfg.Policy.Validate(); err != nil {
		return nil, err
	}
	if cfg.Collateral == nil && !cfg.SkipCollateral {
		return nil, errors.New("TDX verifier: no collateral cache: set Config.Collateral (e.g. a CollateralDir), verification uses no network")
	}
	v := &Verifier{cfg: cfg, roots: cfg.TrustedRoots, log: cfg.Logger}
	if v.cfg.Now == nil {
		v.cfg.Now = time.Now
	}
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	if v.roots == nil {
		v.roots = x509.NewCertPool()
		if !v.roots.AppendCertsFromPEM(intelRootPEM) {
			return nil, errors.New("TDX verifier: the embedded Intel SGX Root CA does not parse")
		}
	}
	return v, nil
}

// VerifyTEE checks the TDX quote in a vTPM attestation (see VerifyQuote).
func (v *Verifier) VerifyTEE(ctx context.Context, att *attestpb.Attestation, reportData []byte) ([]tee.Field, error) {
	q := att.GetTdxAttestation()
	if q == nil {
		return nil, ErrNoEvidence
	}
	return v.VerifyQuote(ctx, q, reportData)
}

// VerifyQuote checks, in this order: that go-tdx-guest verifies the quote
// with the cached collateral (signatures, PCK chain to the trusted
// roots, revocation, collateral validity, TDX module and QE identity,
// TCB status UpToDate), or, with Config.SkipCollateral, the signatures
// and the PCK chain to the trusted roots, and that the quoting enclave
// and the TDX module are Intel's; that XFAM and TD attributes have only
// allowed bits; that REPORT_DATA is reportData; that the TD is not a
// debug TD; and that the quote's fields meet the policy (enforced checks
// reject with a *tee.Mismatch, warn-only ones are logged). It returns
// the quote's fields for display.
func (v *Verifier) VerifyQuote(ctx context.Context, quote *tdxpb.QuoteV4, reportData []byte) ([]tee.Field, error) {
	if quote == nil {
		return nil, ErrNoEvidence
	}
	if len(reportData) != tee.ReportDataSize {
		return nil, fmt.Errorf("expected report data has %d bytes, not %d", len(reportData), tee.ReportDataSize)
	}
	levels, err := v.verifyQuote(ctx, quote)
	if err != nil {
		return nil, err
	}
	if err := checkBase(quote, reportData); err != nil {
		return nil, err
	}
	var launch []tee.Field
	if p := v.cfg.Policy.GCELaunchEndorsement; p != nil {
		l, err := v.checkEndorsedLaunch(quote, *p)
		if err != nil {
			return nil, err
		}
		launch = append(launch, tee.Field{Name: "launch endorsement", Value: l.Describe()})
	}
	if err := v.checkPolicy(quote); err != nil {
		return nil, err
	}
	return append(fields(quote, levels), launch...), nil
}

// checkEndorsedLaunch checks that Google endorsed the quote's MRTD, by
// the endorsement in the owner's collateral cache: unlike SEV-SNP's
// certificate table, a TD quote has no place where the host could attach
// it.
func (v *Verifier) checkEndorsedLaunch(q *tdxpb.QuoteV4, p launchendorsement.Policy) (launchendorsement.TDXLaunch, error) {
	mrtd := q.GetTdQuoteBody().GetMrTd()
	if v.cfg.Collateral == nil {
		return launchendorsement.TDXLaunch{}, fmt.Errorf("TDX quote refused: its MRTD must be one Google endorsed, and without a collateral cache there is no endorsement to check it against (download %s into one)", launchendorsement.TDXURL(mrtd))
	}
	_, blob, err := v.cfg.Collateral.Get(launchendorsement.TDXURL(mrtd))
	if err != nil {
		return launchendorsement.TDXLaunch{}, fmt.Errorf("TDX quote refused: no launch endorsement of its firmware: %w", err)
	}
	l, err := p.CheckTDX(blob, mrtd, v.cfg.Now())
	if err != nil {
		return launchendorsement.TDXLaunch{}, fmt.Errorf("TDX quote refused: %w", err)
	}
	return l, nil
}

// ParseQuote reads a raw TD quote (format v4, as the TDX guest device
// or configfs-tsm returns it) with go-tdx-guest's parser. That parser
// panics on some malformed quotes (it slices by the lengths a quote
// states before checking them against its size); ParseQuote returns an
// error instead, so that a verifier fed untrusted bytes stays up.
func ParseQuote(raw []byte) (quote *tdxpb.QuoteV4, err error) {
	defer func() {
		if r := recover(); r != nil {
			quote, err = nil, fmt.Errorf("malformed TDX quote: %v", r)
		}
	}()
	parsed, err := abi.QuoteToProto(raw)
	if err != nil {
		return nil, fmt.Errorf("malformed TDX quote: %w", err)
	}
	q, ok := parsed.(*tdxpb.QuoteV4)
	if !ok {
		return nil, fmt.Errorf("TDX quote of type %T: only format v4 is supported", parsed)
	}
	return q, nil
}

// tcbLevels are the TCB levels of Intel's collateral that the platform
// and its QE matched.
type tcbLevels struct{ tdx, qe pcs.TcbLevel }

// verifyQuote runs go-tdx-guest's verification offline. Without
// collateral it returns no TCB levels.
func (v *Verifier) verifyQuote(ctx context.Context, quote *tdxpb.QuoteV4) (tcbLevels, error) {
	if err := ctx.Err(); err != nil {
		return tcbLevels{}, err
	}
	now := v.cfg.Now()
	getter := &recordingGetter{src: v.cfg.Collateral}
	withCollateral := !v.cfg.SkipCollateral
	// go-tdx-guest keeps state in its options: a fresh set per quote.
	opts := &verify.Options{
		GetCollateral:    withCollateral,
		CheckRevocations: withCollateral && !v.cfg.SkipRevocationCheck,
		Getter:           getter,
		Now:              &verify.TimeSet{PckCertChain: now, TcbInfo: now, QeIdentity: now, PckCrl: now, RootCaCrl: now},
		TrustedRoots:     v.roots,
	}
	switch {
	case !withCollateral:
		v.log.Warn("TDX quote verified without Intel's collateral: a revoked or out-of-date platform would pass")
	case v.cfg.SkipRevocationCheck:
		v.log.Warn("TDX revocation check skipped: a revoked Intel platform key would pass")
	}
	if err := verify.TdxQuoteContext(ctx, quote, opts); err != nil {
		if getter.miss != nil {
			return tcbLevels{}, fmt.Errorf("verify TDX quote: %w", getter.miss)
		}
		return tcbLevels{}, explain(err, now)
	}
	if !withCollateral {
		return tcbLevels{}, checkIntelIdentities(quote)
	}
	tdx, qe, err := verify.SupportedTcbLevelsFromCollateral(quote, opts)
	if err != nil {
		return tcbLevels{}, fmt.Errorf("read the TDX TCB status from the collateral: %w", err)
	}
	return tcbLevels{tdx: tdx, qe: qe}, nil
}

// failureClasses sort go-tdx-guest's errors. It wraps most of them with
// %v, so they are told apart by their text: its sentinels' messages
// where it has them, its own phrases otherwise. The first class whose
// text appears wins, so the order matters (a collateral signature that
// fails also mentions a signature). An error no class matches is still
// an error, only without advice.
var failureClasses = []struct {
	err   error
	texts []string
}{
	{ErrRevoked, []string{"was revoked at"}},
	{ErrCollateralExpired, sentinelTexts(
		verify.ErrTcbInfoExpired, verify.ErrQeIdentityExpired, verify.ErrPCKCrlExpired, verify.ErrRootCaCrlExpired,
		verify.ErrTcbInfoSigningCertExpired, verify.ErrTcbInfoRootCertExpired,
		verify.ErrQeIdentitySigningCertExpired, verify.ErrQeIdentityRootCertExpired,
		verify.ErrPCKCrlSigningCertExpired, verify.ErrPCKCrlRootCertExpired)},
	{ErrCertificateExpired, append(sentinelTexts(verify.ErrPckLeafCertExpired, verify.ErrIntermediateCaCertExpired, verify.ErrRootCaCertExpired),
		"certificate has expired or is not yet valid")},
	{ErrUntrustedRoot, []string{"certificate signed by unknown authority"}},
	{ErrTCBNotUpToDate, []string{"failed TCB status check"}},
	{ErrCollateralInvalid, []string{"tcbInfo response verification failed", "QeIdentity response verification failed",
		"CRL verification failed", "does not match with PCK Leaf Certificate's issuer name", "could not verify collaterals",
		"unable to receive", "FMSPC from PCK Certificate", "PCEID from PCK Certificate"}},
	{ErrSignature, append(sentinelTexts(verify.ErrHashVerificationFail, verify.ErrSHA56VerificationFail),
		"signature verification", "ECDSA verification failure")},
}

func sentinelTexts(errs ...error) []string {
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = e.Error()
	}
	return out
}

// explain adds the class of a go-tdx-guest error, and so what to do.
func explain(err error, now time.Time) error {
	msg := err.Error()
	for _, c := range failureClasses {
		for _, t := range c.texts {
			if strings.Contains(msg, t) {
				return fmt.Errorf("verify TDX quote at %s: %w: %w", now.UTC().Format(time.RFC3339), c.err, err)
			}
		}
	}
	return fmt.Errorf("verify TDX quote at %s: %w", now.UTC().Format(time.RFC3339), err)
}
