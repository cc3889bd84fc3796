package vtpm

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
	attestpb "github.com/google/go-tpm-tools/proto/attest"
	tpmpb "github.com/google/go-tpm-tools/proto/tpm"
	"github.com/google/go-tpm-tools/quote"
	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/protobuf/proto"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
)

// ValidatorConfig configures a Validator.
type ValidatorConfig struct {
	// Variant is the variant this validator accepts. Required.
	Variant variant.Variant
	// Measurements are the expected PCR values. Required; an empty set
	// would accept any machine, so it is refused.
	Measurements measurements.M
	// AKRoots are the CAs that certify attestation keys (for QEMU: the
	// local cloud's platform CA). Required unless TrustAnyAK is set.
	AKRoots []*x509.Certificate
	// AKIntermediates are CAs between AKRoots and an AK certificate (for
	// GCE: Google's EK/AK intermediate CAs). Intermediates the
	// attestation itself carries are used too; either way the chain must
	// end in AKRoots.
	AKIntermediates []*x509.Certificate
	// TrustAnyAK accepts a quote by any attestation key, certified or not.
	// Anyone can then forge an attestation with a software TPM: for
	// development only, and the validator logs a warning each time.
	TrustAnyAK bool
	// NonZero lists PCRs whose quoted value must not be all zeros,
	// whatever Measurements say of them. It is for a property that no
	// single expected value can state: PCR 15 of a node locked to a
	// cluster holds that cluster's ID, so a verifier that must talk to
	// a member of some cluster (the joining node, checking the join
	// service) lists 15 here. Empty checks no PCR this way.
	NonZero []uint32
	// Logger receives warnings (warn-only PCR mismatches, TrustAnyAK).
	// Nil discards them.
	Logger *slog.Logger
	// Now is the clock for certificate validity. Nil means time.Now.
	Now func() time.Time
	// AKInstance reads the instance a verified AK certificate names (for
	// QEMU: platformca.InstanceOf), for ValidateInstance. It returns the
	// zero Instance for a certificate that names none, and an error for
	// one that names it malformed, which rejects the attestation. Nil
	// means the platform names no instances: ValidateInstance returns
	// the zero Instance.
	AKInstance func(*x509.Certificate) (attestation.Instance, error)
	// TEE verifies the hardware evidence the attestation carries beside
	// the quote (an SEV-SNP report, a TD quote), whose report data must
	// be tee.ReportData of the session. Nil means the variant has none,
	// and any such evidence is ignored.
	TEE TEEVerifier
}

// TEEVerifier checks the hardware evidence in a vTPM attestation (see
// packages snp and tdx).
type TEEVerifier interface {
	// VerifyTEE checks att's hardware evidence, and that its report
	// data is reportData; it returns the report's fields for display.
	VerifyTEE(ctx context.Context, att *attestpb.Attestation, reportData []byte) ([]attestation.Field, error)
}

// Validator checks vTPM attestation documents. It needs no TPM.
type Validator struct {
	cfg ValidatorConfig
	log *slog.Logger
}

// NewValidator returns a validator, or an error if cfg is incomplete.
func NewValidator(cfg ValidatorConfig) (*Validator, error) {
	if cfg.Variant == (variant.Variant{}) {
		return nil, errors.New("vtpm validator: Variant is required")
	}
	if len(cfg.Measurements) == 0 {
		return nil, errors.New("vtpm validator: no expected measurements given; refusing to accept any machine")
	}
	if err := cfg.Measurements.Validate(); err != nil {
		return nil, fmt.Errorf("vtpm validator: %w", err)
	}
	for _, pcr := range cfg.NonZero {
		if pcr >= measurements.NumPCRs {
			return nil, fmt.Errorf("vtpm validator: NonZero names PCR %d, which does not exist (valid PCRs are 0-%d)", pcr, measurements.NumPCRs-1)
		}
	}
	if len(cfg.AKRoots) == 0 && !cfg.TrustAnyAK {
		return nil, errors.New("vtpm validator: no platform CA given to check attestation keys against (set AKRoots, or TrustAnyAK for development)")
	}
	v := &Validator{cfg: cfg, log: cfg.Logger}
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	if v.cfg.Now == nil {
		v.cfg.Now = time.Now
	}
	if cfg.TrustAnyAK {
		v.log.Warn("INSECURE: attestation keys are not checked against any platform CA; any software TPM can impersonate a node",
			"variant", cfg.Variant.String())
	}
	return v, nil
}

// Variant implements attestation.Validator.
func (v *Validator) Variant() variant.Variant { return v.cfg.Variant }

// Validate implements attestation.Validator. It checks, in order:
//   - the document and the TPM attestation inside it decode;
//   - the AK is a restricted signing key that never leaves its TPM, and
//     (unless TrustAnyAK) its certificate chains to AKRoots, is valid now
//     and certifies exactly this key;
//   - the PCR values sent with the SHA-256 quote are exactly the PCRs its
//     signed selection names, each a valid index (0-23) with a value of
//     exactly the bank's digest size (see checkPCRValues);
//   - the SHA-256 quote is signed by the AK, starts with TPM_GENERATED,
//     carries BindingDigest(nonce, user data) as qualifying data, and its
//     PCR digest matches the PCR values sent with it;
//   - the firmware event log followed by the userspace measurement log
//     replays to the quoted value of every PCR they touch, and of PCRs 11
//     and 15 even where they touch neither (an untouched PCR replays to
//     zero), so a log that is missing or cut short is refused;
//   - the quoted PCRs equal the expected measurements: an enforced
//     mismatch rejects, naming the PCR, both values and what the logs say
//     was measured into it (made printable and bounded: the node wrote
//     it); a warn-only mismatch is logged the same way;
//   - every PCR in NonZero is quoted and not all zeros (a *ZeroPCRError
//     otherwise);
//   - with AKInstance set, the instance the verified AK certificate names
//     is well-formed (see ValidateProof);
//   - with TEE set, the hardware evidence verifies and binds the same
//     nonce and user data as the quote (tee.ReportData).
//
// It returns the user data the document binds; the caller must check it.
func (v *Validator) Validate(ctx context.Context, raw, nonce []byte) ([]byte, error) {
	p, err := v.ValidateProof(ctx, raw, nonce)
	return p.UserData, err
}

// ValidateProof implements attestation.ProofValidator: it checks what
// Validate checks and returns, besides the user data, the instance that
// ValidatorConfig.AKInstance reads from the AK certificate, which has
// then been verified against AKRoots, and the hardware report's fields.
// With TrustAnyAK no certificate is checked, and the instance is always
// the zero Instance: an unverified certificate names nobody.
func (v *Validator) ValidateProof(ctx context.Context, raw, nonce []byte) (attestation.Proof, error) {
	userData, inst, hw, err := v.validate(ctx, raw, nonce)
	if err != nil {
		return attestation.Proof{}, err
	}
	return attestation.Proof{UserData: userData, Instance: inst, Hardware: hw}, nil
}

func (v *Validator) validate(ctx context.Context, raw, nonce []byte) ([]byte, attestation.Instance, []attestation.Field, error) {
	var none attestation.Instance
	if len(nonce) == 0 {
		return nil, none, nil, errors.New("validate attestation: empty nonce")
	}
	doc, err := ParseDocument(raw)
	if err != nil {
		return nil, none, nil, err
	}
	var att attestpb.Attestation
	if err := proto.Unmarshal(doc.Attestation, &att); err != nil {
		return nil, none, nil, fmt.Errorf("decode TPM attestation: %w", err)
	}
	ak, cert, err := v.checkAK(&att)
	if err != nil {
		return nil, none, nil, err
	}
	var inst attestation.Instance
	if cert != nil && v.cfg.AKInstance != nil {
		if inst, err = v.cfg.AKInstance(cert); err != nil {
			return nil, none, nil, fmt.Errorf("attestation key certificate: %w", err)
		}
	}
	q, err := sha256Quote(&att)
	if err != nil {
		return nil, none, nil, err
	}
	if err := checkPCRValues(q); err != nil {
		return nil, none, nil, fmt.Errorf("TPM quote: %w", err)
	}
	if err := quote.Verify(q, ak, attestation.BindingDigest(nonce, doc.UserData)); err != nil {
		return nil, none, nil, fmt.Errorf("TPM quote does not verify for this nonce and user data (replayed, relayed or tampered): %w", err)
	}
	quoted := q.GetPcrs().GetPcrs()

	userLog, err := pcrlog.Parse(doc.MeasurementLog)
	if err != nil {
		return nil, none, nil, fmt.Errorf("userspace measurement log: %w", err)
	}
	fwEvents, err := firmwareEvents(att.GetEventLog())
	if err != nil {
		return nil, none, nil, err
	}
	if err := replay(fwEvents, userLog, quoted); err != nil {
		return nil, none, nil, err
	}

	warnings, err := v.cfg.Measurements.Compare(quoted)
	if err != nil {
		return nil, none, nil, fmt.Errorf("measurements do not match: %w%s", err, v.explain(err, fwEvents, userLog))
	}
	if err := checkNonZero(v.cfg.NonZero, quoted); err != nil {
		return nil, none, nil, err
	}
	for _, w := range warnings {
		v.log.Warn("warn-only PCR does not match its expected value",
			"pcr", w.PCR, "expected", fmt.Sprintf("%x", w.Expected), "actual", fmt.Sprintf("%x", w.Actual),
			"measured", joinDescriptions(describe(w.PCR, fwEvents, userLog)))
	}
	var hw []attestation.Field
	if v.cfg.TEE != nil {
		if hw, err = v.cfg.TEE.VerifyTEE(ctx, &att, tee.ReportData(nonce, doc.UserData)); err != nil {
			return nil, none, nil, err
		}
	}
	if v.cfg.TrustAnyAK {
		v.log.Warn("INSECURE: accepted an attestation without checking its attestation key's certificate",
			"variant", v.cfg.Variant.String())
	}
	return doc.UserData, inst, hw, nil
}

// ZeroPCRError is a PCR listed in ValidatorConfig.NonZero that the quote
// shows as all zeros, or does not cover.
type ZeroPCRError struct{ PCR uint32 }

func (e *ZeroPCRError) Error() string {
	what := "nothing was measured into it"
	if e.PCR == 15 {
		what = "the node lock never extended it, so the node is locked to no cluster"
	}
	return fmt.Sprintf("PCR %d is zero (%s), and this verifier requires it to hold a measurement", e.PCR, what)
}

// checkNonZero returns a *ZeroPCRError for the first PCR in pcrs that
// quoted has as all zeros or not at all.
func checkNonZero(pcrs []uint32, quoted map[uint32][]byte) error {
	for _, pcr := range pcrs {
		if v := quoted[pcr]; len(v) == 0 || bytes.Equal(v, make([]byte, len(v))) {
			return &ZeroPCRError{PCR: pcr}
		}
	}
	return nil
}

// checkAK returns the attestation key and, unless TrustAnyAK, its
// certificate, verified against AKRoots (with TrustAnyAK, no certificate).
func (v *Validator) checkAK(att *attestpb.Attestation) (crypto.PublicKey, *x509.Certificate, error) {
	pub, err := tpm2.DecodePublic(att.GetAkPub())
	if err != nil {
		return nil, nil, fmt.Errorf("decode attestation key: %w", err)
	}
	const want = tpm2.FlagRestricted | tpm2.FlagSign | tpm2.FlagFixedTPM | tpm2.FlagFixedParent
	if pub.Attributes&want != want {
		return nil, nil, fmt.Errorf("attestation key attributes %#x lack restricted/sign/fixedTPM/fixedParent: it could sign data the TPM did not generate", uint32(pub.Attributes))
	}
	key, err := pub.Key()
	if err != nil {
		return nil, nil, fmt.Errorf("attestation key: %w", err)
	}
	if v.cfg.TrustAnyAK {
		return key, nil, nil
	}
	if len(att.GetAkCert()) == 0 {
		return nil, nil, errors.New("attestation key has no certificate: the platform did not certify it (is the vTPM provisioned by the cloud?)")
	}
	cert, err := x509.ParseCertificate(att.GetAkCert())
	if err != nil {
		return nil, nil, fmt.Errorf("parse attestation key certificate: %w", err)
	}
	var carried []*x509.Certificate
	for i, der := range att.GetIntermediateCerts() {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, nil, fmt.Errorf("parse intermediate certificate %d of the attestation key: %w", i, err)
		}
		carried = append(carried, c)
	}
	if err := VerifyAKCert(cert, v.cfg.AKRoots, append(carried, v.cfg.AKIntermediates...), v.cfg.Now()); err != nil {
		return nil, nil, fmt.Errorf("attestation key certificate is not signed by the platform CA: %w", err)
	}
	eq, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !eq.Equal(key) {
		return nil, nil, errors.New("attestation key certificate certifies a different key than the one that signed the quote")
	}
	return key, cert, nil
}

// oidSubjectAltName is X.509's subject alternative name extension.
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// VerifyAKCert checks that cert chains through intermediates to roots and
// is valid at now. A TPM's EK or AK certificate marks its subject
// alternative name critical and puts the TPM's make and model there as a
// directory name, which crypto/x509 does not read and so counts as an
// unhandled critical extension; that name carries no authority here, so
// it is not held against the certificate (on a copy: cert is left alone).
func VerifyAKCert(cert *x509.Certificate, roots, intermediates []*x509.Certificate, now time.Time) error {
	c := *cert
	c.UnhandledCriticalExtensions = slices.DeleteFunc(slices.Clone(cert.UnhandledCriticalExtensions), func(o asn1.ObjectIdentifier) bool {
		return o.Equal(oidSubjectAltName)
	})
	opts := x509.VerifyOptions{
		Roots:         x509.NewCertPool(),
		Intermediates: x509.NewCertPool(),
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}
	for _, r := range roots {
		opts.Roots.AddCert(r)
	}
	for _, i := range intermediates {
		opts.Intermediates.AddCert(i)
	}
	_, err := c.Verify(opts)
	return err
}

func sha256Quote(att *attestpb.Attestation) (*tpmpb.Quote, error) {
	for _, q := range att.GetQuotes() {
		if q.GetPcrs().GetHash() == tpmpb.HashAlgo_SHA256 {
			return q, nil
		}
	}
	return nil, errors.New("attestation has no quote of the SHA-256 PCR bank")
}

// checkPCRValues checks the form of the PCR values sent beside q against
// the PCR selection the TPM signed in q. The signed PCR digest covers only
// the concatenation of the values in index order; it says nothing about
// where one value ends and the next begins. Without this check a node could
// move bytes between neighbouring values and show, in an enforced PCR, any
// value it can produce in another PCR, and quote.Verify would still match.
//
// It runs before the signature check only so that its errors can name the
// PCR; on its own it never accepts anything.
func checkPCRValues(q *tpmpb.Quote) error {
	bank := q.GetPcrs().GetHash()
	h, err := tpm2.Algorithm(bank).Hash()
	if err != nil || !h.Available() {
		return fmt.Errorf("PCR values are of bank %v, which has no supported hash", bank)
	}
	values := q.GetPcrs().GetPcrs()
	sent := slices.Sorted(maps.Keys(values))
	for _, pcr := range sent {
		if pcr >= measurements.NumPCRs {
			return fmt.Errorf("value sent for PCR %d, which does not exist (valid PCRs are 0-%d)", pcr, measurements.NumPCRs-1)
		}
		if n := len(values[pcr]); n != h.Size() {
			return fmt.Errorf("PCR %d value has %d bytes, not the %d of a %v digest: the PCR values were re-split or altered", pcr, n, h.Size(), bank)
		}
	}

	att, err := tpm2.DecodeAttestationData(q.GetQuote())
	if err != nil {
		return fmt.Errorf("decode quote: %w", err)
	}
	if att.Type != tpm2.TagAttestQuote || att.AttestedQuoteInfo == nil {
		return fmt.Errorf("signed structure has type %#x, not a quote", uint16(att.Type))
	}
	sel := att.AttestedQuoteInfo.PCRSelection
	if sel.Hash != tpm2.Algorithm(bank) {
		return fmt.Errorf("quote selects PCRs of bank %#x but the values sent are of bank %v", uint16(sel.Hash), bank)
	}
	selected := make(map[uint32]bool, len(sel.PCRs))
	for _, pcr := range sel.PCRs {
		if pcr < 0 || pcr >= measurements.NumPCRs {
			return fmt.Errorf("quote selects PCR %d, which does not exist (valid PCRs are 0-%d)", pcr, measurements.NumPCRs-1)
		}
		if _, ok := values[uint32(pcr)]; !ok {
			return fmt.Errorf("quote covers PCR %d but no value was sent for it", pcr)
		}
		selected[uint32(pcr)] = true
	}
	for _, pcr := range sent {
		if !selected[pcr] {
			return fmt.Errorf("value sent for PCR %d, which the quote does not cover", pcr)
		}
	}
	return nil
}

// loggedPCRs are the PCRs Orrery's own code extends, recording every extend
// in the userspace measurement log: the initrd's phase markers go into 11,
// the node lock's cluster ID into 15. Replay checks them even when no log
// mentions them, so that dropping the log, or its last entries, does not
// take them out of the check.
var loggedPCRs = []uint32{11, 15}

// event is one measurement from either log, reduced to what replay needs.
type event struct {
	pcr         uint32
	digest      []byte // nil for a StartupLocality marker
	locality    byte   // for a StartupLocality marker: PCR 0's reset value ends in it
	description string
}

func firmwareEvents(raw []byte) ([]event, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	el, err := tcg.ParseEventLog(raw, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		return nil, fmt.Errorf("parse firmware event log: %w", err)
	}
	var out []event
	for _, e := range el.Events(register.HashSHA256) {
		if e.Index < 0 || e.Index > 23 {
			return nil, fmt.Errorf("firmware event log: event for PCR %d out of range", e.Index)
		}
		if e.Type == tcg.NoAction {
			// Not extended; on PCR 0 it may set the start locality.
			if e.Index == 0 && len(e.Data) == 17 && strings.HasPrefix(string(e.Data), "StartupLocality") {
				out = append(out, event{pcr: 0, locality: e.Data[16], description: "firmware: startup locality"})
			}
			continue
		}
		if len(e.Digest) != crypto.SHA256.Size() {
			return nil, fmt.Errorf("firmware event log: event %d (PCR %d) has no SHA-256 digest", e.Num(), e.Index)
		}
		out = append(out, event{pcr: uint32(e.Index), digest: e.Digest, description: describeFirmwareEvent(e)})
	}
	return out, nil
}

func describeFirmwareEvent(e tcg.Event) string {
	name, _ := e.Type.KnownName()
	if name == "" {
		name = fmt.Sprintf("event type %#x", uint32(e.Type))
	}
	if e.Type == tcg.Ipl {
		// systemd-stub names the UKI section it measured (".linux",
		// ".initrd", ...), which is what an operator needs to see.
		if what := utf16Text(e.Data); what != "" {
			return "firmware: " + name + " " + what
		}
	}
	return "firmware: " + name
}

// replay recomputes every PCR the logs touch and every PCR in loggedPCRs,
// firmware events first, and compares the result with the quoted values.
func replay(fw []event, user []pcrlog.Entry, quoted map[uint32][]byte) error {
	pcrs := map[uint32][]byte{}
	for _, e := range fw {
		if e.digest == nil {
			start := make([]byte, crypto.SHA256.Size())
			start[len(start)-1] = e.locality
			pcrs[0] = start
			continue
		}
		pcrs[e.pcr] = pcrlog.Extend(crypto.SHA256, pcrs[e.pcr], e.digest)
	}
	pcrs, err := pcrlog.Replay(user, crypto.SHA256, pcrs)
	if err != nil {
		return fmt.Errorf("replay userspace measurement log: %w", err)
	}
	for _, pcr := range loggedPCRs {
		if _, ok := pcrs[pcr]; !ok {
			pcrs[pcr] = make([]byte, crypto.SHA256.Size())
		}
	}
	for _, pcr := range slices.Sorted(maps.Keys(pcrs)) {
		want := pcrs[pcr]
		got, ok := quoted[pcr]
		switch {
		case !ok && slices.Contains(loggedPCRs, pcr):
			return fmt.Errorf("the quote does not cover PCR %d, which the userspace measurement log must explain", pcr)
		case !ok:
			return fmt.Errorf("event logs measure PCR %d but the quote does not cover it", pcr)
		case bytes.Equal(got, want):
			continue
		case slices.Contains(loggedPCRs, pcr) && !slices.Contains(pcrlog.PCRs(user), pcr):
			return fmt.Errorf("quoted PCR %d is %x but the userspace measurement log has no entry for it: the log is missing or was cut short", pcr, got)
		default:
			return fmt.Errorf("event logs do not replay to the quoted PCR %d (replayed %x, quoted %x): a log was altered or is incomplete", pcr, want, got)
		}
	}
	return nil
}

func describe(pcr uint32, fw []event, user []pcrlog.Entry) []string {
	var out []string
	for _, e := range fw {
		if e.pcr == pcr && e.digest != nil {
			out = append(out, e.description)
		}
	}
	return append(out, pcrlog.Describe(user, pcr)...)
}

// explain lists, for each enforced PCR that differs, what the logs say was
// measured into it, so an operator can tell which component changed. The
// node wrote those descriptions: they are made printable and bounded (see
// joinDescriptions), so that the only line breaks are the ones put here.
func (v *Validator) explain(err error, fw []event, user []pcrlog.Entry) string {
	var b strings.Builder
	for _, pcr := range measurements.MismatchedPCRs(err) {
		what := describe(pcr, fw, user)
		if len(what) == 0 {
			continue
		}
		line := fmt.Sprintf("\nPCR %d was measured from: %s", pcr, joinDescriptions(what))
		if b.Len()+len(line) > maxExplainText {
			b.WriteString("\n(descriptions of further PCRs left out)")
			break
		}
		b.WriteString(line)
	}
	return b.String()
}
