// Package tdxtest gives tests Intel TDX evidence without a TDX machine: a
// test PKI that stands in for Intel (a root, a PCK platform CA, a PCK
// certificate and a TCB signing certificate, with Intel's names, and a
// quoting enclave's attestation key), and TDs on its platform whose TD
// reports and TD quotes show the measurements a test gives them over the
// report data it asks for.
//
// A quote is go-tdx-guest's real test quote (a production Sapphire Rapids
// TD's, with Intel's own QE report) with its TD report body changed and
// signed again under the test PKI, so that all but the signatures and the
// PCK chain is real. Only a verifier told to trust PKI.Root (tdx.Config's
// TrustedRoots) accepts it; under Intel's root it is refused.
package tdxtest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/google/go-tdx-guest/abi"
	"github.com/google/go-tdx-guest/pcs"
	tdxpb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/google/go-tdx-guest/testing/testdata"
	"github.com/google/go-tdx-guest/verify"
	"google.golang.org/protobuf/proto"
)

// intelRootCRLURL is the CRL distribution point of Intel's SGX Root CA,
// which go-tdx-guest fetches the root CA CRL from.
const intelRootCRLURL = "https://certificates.trustedservices.intel.com/IntelSGXRootCA.der"

// PKI stands in for Intel and for one platform's quoting enclave. Its
// certificates carry Intel's names and the real PCK certificate's SGX
// extension (FMSPC, PCE ID, TCB), so that go-tdx-guest treats them as
// Intel's; its keys are fresh.
type PKI struct {
	Root, PCKCA, PCK, TCBSigner *x509.Certificate
	RootKey, PCKCAKey, TCBKey   *ecdsa.PrivateKey
	// PCKExtensions are the SGX extension of the PCK certificate: the
	// real platform's.
	PCKExtensions *pcs.PckExtensions
	// ValidFrom and ValidTo bound every certificate of the PKI.
	ValidFrom, ValidTo time.Time

	pckKey    *ecdsa.PrivateKey
	attestKey *ecdsa.PrivateKey // the quoting enclave's attestation key
}

// NewPKI makes a PKI whose certificates are valid from a year before at
// to a year after it.
func NewPKI(tb testing.TB, at time.Time) *PKI {
	tb.Helper()
	realChain, err := verify.ExtractChainFromQuote(RealQuote(tb))
	if err != nil {
		tb.Fatal(err)
	}
	p := &PKI{ValidFrom: at.AddDate(-1, 0, 0), ValidTo: at.AddDate(1, 0, 0)}
	if p.PCKExtensions, err = pcs.PckCertificateExtensions(realChain.PCKCertificate); err != nil {
		tb.Fatal(err)
	}
	p.RootKey, p.PCKCAKey, p.pckKey, p.TCBKey, p.attestKey = newKey(tb), newKey(tb), newKey(tb), newKey(tb), newKey(tb)
	ca := func(cn string) *x509.Certificate {
		c := p.template(tb, cn)
		c.IsCA, c.BasicConstraintsValid, c.KeyUsage = true, true, x509.KeyUsageCertSign|x509.KeyUsageCRLSign
		return c
	}
	root := ca("Intel SGX Root CA")
	// go-tdx-guest fetches the root CA CRL from the root's distribution
	// point: Intel's URL, so a collateral cache serves it as for Intel's
	// root.
	root.CRLDistributionPoints = []string{intelRootCRLURL}
	p.Root = p.issue(tb, root, nil, p.RootKey)
	p.PCKCA = p.issue(tb, ca("Intel SGX PCK Platform CA"), p.Root, p.PCKCAKey)
	pck := p.template(tb, "Intel SGX PCK Certificate")
	// The six extensions of Intel's PCK certificates, which go-tdx-guest
	// counts: the authority key ID (added by x509), these four, and the
	// real PCK certificate's SGX extension (FMSPC, PCE ID, CPU SVN).
	pck.CRLDistributionPoints = []string{pcs.PckCrlURL("platform")}
	pck.SubjectKeyId = []byte("orrery test PCK")
	pck.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageContentCommitment
	pck.BasicConstraintsValid = true
	for _, e := range realChain.PCKCertificate.Extensions {
		if e.Id.Equal(pcs.OidSgxExtension) {
			pck.ExtraExtensions = append(pck.ExtraExtensions, e)
		}
	}
	p.PCK = p.issue(tb, pck, p.PCKCA, p.pckKey)
	p.TCBSigner = p.issue(tb, p.template(tb, "Intel SGX TCB Signing"), p.Root, p.TCBKey)
	return p
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

func (p *PKI) template(tb testing.TB, cn string) *x509.Certificate {
	tb.Helper()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		tb.Fatal(err)
	}
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"Orrery test PKI, not Intel"}},
		NotBefore:    p.ValidFrom, NotAfter: p.ValidTo,
	}
}

// issue signs tmpl for key's public half with the parent's key, or
// self-signs when parent is nil.
func (p *PKI) issue(tb testing.TB, tmpl, parent *x509.Certificate, key *ecdsa.PrivateKey) *x509.Certificate {
	tb.Helper()
	signer := key
	if parent == nil {
		parent = tmpl
	} else {
		signer = map[*x509.Certificate]*ecdsa.PrivateKey{p.Root: p.RootKey, p.PCKCA: p.PCKCAKey}[parent]
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		tb.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// Roots is a pool of the PKI's root alone: what a verifier that accepts
// this PKI's quotes trusts.
func (p *PKI) Roots() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(p.Root)
	return pool
}

// RealQuote is go-tdx-guest's real test quote (the same bytes as
// internal/attestation/tdx/testdata/tdx_prod_quote_SPR_E4.dat), parsed.
func RealQuote(tb testing.TB) *tdxpb.QuoteV4 {
	tb.Helper()
	q, err := abi.QuoteToProto(testdata.RawQuote)
	if err != nil {
		tb.Fatal(err)
	}
	return q.(*tdxpb.QuoteV4)
}

// Seal returns a copy of q signed as a platform of this PKI would sign
// it: the attestation key signs header and TD report body, the QE report
// binds that key and is signed by the PCK key, and the PCK chain is this
// PKI's.
func (p *PKI) Seal(tb testing.TB, q *tdxpb.QuoteV4) *tdxpb.QuoteV4 {
	tb.Helper()
	sealed, err := p.seal(q)
	if err != nil {
		tb.Fatal(err)
	}
	return sealed
}

func (p *PKI) seal(in *tdxpb.QuoteV4) (*tdxpb.QuoteV4, error) {
	q := proto.Clone(in).(*tdxpb.QuoteV4)
	sd := q.GetSignedData()
	qe := sd.GetCertificationData().GetQeReportCertificationData()
	pub, err := p.attestKey.PublicKey.Bytes()
	if err != nil {
		return nil, err
	}
	sd.EcdsaAttestationKey = pub[1:] // X||Y, without the uncompressed-point prefix
	h := sha256.Sum256(append(bytes.Clone(sd.EcdsaAttestationKey), qe.GetQeAuthData().GetData()...))
	qe.QeReport.ReportData = append(h[:], make([]byte, 32)...)
	report, err := abi.EnclaveReportToAbiBytes(qe.GetQeReport())
	if err != nil {
		return nil, err
	}
	if qe.QeReportSignature, err = signRaw(p.pckKey, report); err != nil {
		return nil, err
	}

	chain := PEMChain(p.PCK, p.PCKCA, p.Root)
	grow := len(chain) - len(qe.PckCertificateChainData.PckCertChain)
	qe.PckCertificateChainData.PckCertChain = chain
	qe.PckCertificateChainData.Size = uint32(len(chain))
	sd.CertificationData.Size = uint32(int(sd.CertificationData.Size) + grow)
	q.SignedDataSize = uint32(int(q.SignedDataSize) + grow)

	header, err := abi.HeaderToAbiBytes(q.GetHeader())
	if err != nil {
		return nil, err
	}
	body, err := abi.TdQuoteBodyToAbiBytes(q.GetTdQuoteBody())
	if err != nil {
		return nil, err
	}
	if sd.Signature, err = signRaw(p.attestKey, append(header, body...)); err != nil {
		return nil, err
	}
	return q, nil
}

// SignRaw signs SHA-256(msg) with key and returns r||s, the form of the
// signatures in a quote and in Intel's collateral.
func SignRaw(tb testing.TB, key *ecdsa.PrivateKey, msg []byte) []byte {
	tb.Helper()
	sig, err := signRaw(key, msg)
	if err != nil {
		tb.Fatal(err)
	}
	return sig
}

func signRaw(key *ecdsa.PrivateKey, msg []byte) ([]byte, error) {
	h := sha256.Sum256(msg)
	der, err := ecdsa.SignASN1(rand.Reader, key, h[:])
	if err != nil {
		return nil, err
	}
	var sig struct{ R, S *big.Int }
	if _, err := asn1.Unmarshal(der, &sig); err != nil {
		return nil, err
	}
	return append(sig.R.FillBytes(make([]byte, 32)), sig.S.FillBytes(make([]byte, 32))...), nil
}

// PEMChain is certs in PEM, one after the other.
func PEMChain(certs ...*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

// TD is a trust domain on a PKI's platform. Its fields start as the real
// quote's; a test changes them to play another firmware or boot chain.
type TD struct {
	PKI *PKI
	// MRTD is the TD's build-time measurement (48 bytes).
	MRTD []byte
	// RTMR are its runtime measurement registers (48 bytes each).
	RTMR [4][]byte
	// TDAttributes are its TD attributes (8 bytes, little endian).
	TDAttributes []byte
}

// NewTD is a TD on pki's platform with the real quote's measurements.
func NewTD(tb testing.TB, pki *PKI) *TD {
	tb.Helper()
	b := RealQuote(tb).GetTdQuoteBody()
	td := &TD{PKI: pki, MRTD: bytes.Clone(b.GetMrTd()), TDAttributes: bytes.Clone(b.GetTdAttributes())}
	for i, r := range b.GetRtmrs() {
		td.RTMR[i] = bytes.Clone(r)
	}
	return td
}

// IsSupported is go-tdx-guest's client.QuoteProvider's: a TD always is.
func (td *TD) IsSupported() error { return nil }

// GetRawQuote is a TD quote (format v4) of the TD over reportData, as
// the guest's quote provider returns it: a TD implements go-tdx-guest's
// client.QuoteProvider.
func (td *TD) GetRawQuote(reportData [64]byte) ([]byte, error) {
	q, err := abi.QuoteToProto(testdata.RawQuote)
	if err != nil {
		return nil, err
	}
	quote := q.(*tdxpb.QuoteV4)
	b := quote.GetTdQuoteBody()
	if len(td.MRTD) != len(b.MrTd) || len(td.TDAttributes) != len(b.TdAttributes) {
		return nil, errors.New("tdxtest: MRTD or TD attributes of the wrong size")
	}
	b.MrTd, b.TdAttributes, b.ReportData = bytes.Clone(td.MRTD), bytes.Clone(td.TDAttributes), reportData[:]
	for i, r := range td.RTMR {
		if len(r) != len(b.Rtmrs[i]) {
			return nil, fmt.Errorf("tdxtest: RTMR%d has %d bytes, want %d", i, len(r), len(b.Rtmrs[i]))
		}
		b.Rtmrs[i] = bytes.Clone(r)
	}
	sealed, err := td.PKI.seal(quote)
	if err != nil {
		return nil, err
	}
	return abi.QuoteToAbiBytes(sealed)
}

// Offsets in a TDREPORT_STRUCT (Intel TDX Module ABI): REPORTMACSTRUCT
// (256 bytes: REPORTTYPE first, REPORTDATA at 128), TEE_TCB_INFO (239)
// and 17 reserved bytes, then TDINFO_STRUCT at 512 (ATTRIBUTES, XFAM,
// MRTD, MRCONFIGID, MROWNER, MROWNERCONFIG, RTMR0-3, ...).
const (
	tdReportSize           = 1024
	tdReportTypeTDX        = 0x81
	tdReportDataOffset     = 128
	tdReportAttrOffset     = 512
	tdReportMRTDOffset     = 512 + 16
	tdReportRTMR0Offset    = 512 + 16 + 4*48
	tdReportMeasurementLen = 48
)

// Report is the TD's TDREPORT_STRUCT over reportData, as the Linux TDX
// guest driver's TDX_CMD_GET_REPORT0 returns it: the TD's attributes,
// MRTD, RTMRs and report data at their places. Its MAC and TCB info are
// zero (only the TDX module could make them, and only it checks them).
func (td *TD) Report(reportData [64]byte) ([]byte, error) {
	if len(td.MRTD) != tdReportMeasurementLen || len(td.TDAttributes) != 8 {
		return nil, errors.New("tdxtest: MRTD or TD attributes of the wrong size")
	}
	r := make([]byte, tdReportSize)
	r[0] = tdReportTypeTDX
	copy(r[tdReportDataOffset:], reportData[:])
	copy(r[tdReportAttrOffset:], td.TDAttributes)
	copy(r[tdReportMRTDOffset:], td.MRTD)
	for i, m := range td.RTMR {
		if len(m) != tdReportMeasurementLen {
			return nil, fmt.Errorf("tdxtest: RTMR%d has %d bytes, want %d", i, len(m), tdReportMeasurementLen)
		}
		copy(r[tdReportRTMR0Offset+i*tdReportMeasurementLen:], m)
	}
	return r, nil
}
