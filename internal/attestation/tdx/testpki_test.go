package tdx

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/google/go-tdx-guest/abi"
	"github.com/google/go-tdx-guest/pcs"
	tdxpb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/google/go-tdx-guest/verify"
	"google.golang.org/protobuf/proto"
)

// testPKI stands in for Intel: a root, a PCK platform CA, a PCK
// certificate and a TCB signing certificate with Intel's names, and a
// quoting enclave's attestation key. It re-signs the real quote, so that
// the real TD report body can be carried through every check to
// acceptance (Intel's collateral for the real platform refuses its TCB),
// and it issues collateral and CRLs, so that revocation and TCB status
// can be tested: Intel's real CRL and TCB info cannot be re-signed.
type testPKI struct {
	root, pckCA, pck, tcbSigner       *x509.Certificate
	rootKey, pckCAKey, pckKey, tcbKey *ecdsa.PrivateKey
	attestKey                         *ecdsa.PrivateKey
	pckExt                            *pcs.PckExtensions
	validFrom, validTo, revokedAt     time.Time
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	realChain, err := verify.ExtractChainFromQuote(parseQuote(t, realQuoteRaw(t)))
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{validFrom: realTime.AddDate(-1, 0, 0), validTo: realTime.AddDate(1, 0, 0), revokedAt: realTime.AddDate(0, 0, -1)}
	if p.pckExt, err = pcs.PckCertificateExtensions(realChain.PCKCertificate); err != nil {
		t.Fatal(err)
	}
	p.rootKey, p.pckCAKey, p.pckKey, p.tcbKey, p.attestKey = newKey(t), newKey(t), newKey(t), newKey(t), newKey(t)
	ca := func(cn string) *x509.Certificate {
		c := p.template(t, cn)
		c.IsCA, c.BasicConstraintsValid, c.KeyUsage = true, true, x509.KeyUsageCertSign|x509.KeyUsageCRLSign
		return c
	}
	root := ca("Intel SGX Root CA")
	// go-tdx-guest fetches the root CA CRL from the root's distribution
	// point: Intel's URL, so the cache serves it as for Intel's root.
	root.CRLDistributionPoints = []string{intelRootCRLURL}
	p.root = p.issue(t, root, nil, p.rootKey)
	p.pckCA = p.issue(t, ca("Intel SGX PCK Platform CA"), p.root, p.pckCAKey)
	pck := p.template(t, "Intel SGX PCK Certificate")
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
	p.pck = p.issue(t, pck, p.pckCA, p.pckKey)
	p.tcbSigner = p.issue(t, p.template(t, "Intel SGX TCB Signing"), p.root, p.tcbKey)
	return p
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func (p *testPKI) template(t *testing.T, cn string) *x509.Certificate {
	t.Helper()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		t.Fatal(err)
	}
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"Orrery test PKI, not Intel"}},
		NotBefore:    p.validFrom, NotAfter: p.validTo,
	}
}

// issue signs tmpl for key's public half with the parent's key, or
// self-signs when parent is nil.
func (p *testPKI) issue(t *testing.T, tmpl, parent *x509.Certificate, key *ecdsa.PrivateKey) *x509.Certificate {
	t.Helper()
	signer := key
	if parent == nil {
		parent = tmpl
	} else {
		signer = map[*x509.Certificate]*ecdsa.PrivateKey{p.root: p.rootKey, p.pckCA: p.pckCAKey}[parent]
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (p *testPKI) roots() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(p.root)
	return pool
}

// rawSign signs SHA-256(msg) and returns r||s, the quote's format.
func rawSign(t *testing.T, key *ecdsa.PrivateKey, msg []byte) []byte {
	t.Helper()
	h := sha256.Sum256(msg)
	der, err := ecdsa.SignASN1(rand.Reader, key, h[:])
	if err != nil {
		t.Fatal(err)
	}
	var sig struct{ R, S *big.Int }
	if _, err := asn1.Unmarshal(der, &sig); err != nil {
		t.Fatal(err)
	}
	return append(sig.R.FillBytes(make([]byte, 32)), sig.S.FillBytes(make([]byte, 32))...)
}

func pemChain(certs ...*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

// seal returns a copy of q signed as a platform of this PKI would sign
// it: the attestation key signs header and TD report body, the QE report
// binds that key and is signed by the PCK key, and the PCK chain is this
// PKI's.
func (p *testPKI) seal(t *testing.T, in *tdxpb.QuoteV4) *tdxpb.QuoteV4 {
	t.Helper()
	q := proto.Clone(in).(*tdxpb.QuoteV4)
	sd := q.GetSignedData()
	qe := sd.GetCertificationData().GetQeReportCertificationData()
	pub, err := p.attestKey.PublicKey.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	sd.EcdsaAttestationKey = pub[1:] // X||Y, without the uncompressed-point prefix
	h := sha256.Sum256(append(bytes.Clone(sd.EcdsaAttestationKey), qe.GetQeAuthData().GetData()...))
	qe.QeReport.ReportData = append(h[:], make([]byte, 32)...)
	report, err := abi.EnclaveReportToAbiBytes(qe.GetQeReport())
	if err != nil {
		t.Fatal(err)
	}
	qe.QeReportSignature = rawSign(t, p.pckKey, report)

	chain := pemChain(p.pck, p.pckCA, p.root)
	grow := len(chain) - len(qe.PckCertificateChainData.PckCertChain)
	qe.PckCertificateChainData.PckCertChain = chain
	qe.PckCertificateChainData.Size = uint32(len(chain))
	sd.CertificationData.Size = uint32(int(sd.CertificationData.Size) + grow)
	q.SignedDataSize = uint32(int(q.SignedDataSize) + grow)

	header, err := abi.HeaderToAbiBytes(q.GetHeader())
	if err != nil {
		t.Fatal(err)
	}
	body, err := abi.TdQuoteBodyToAbiBytes(q.GetTdQuoteBody())
	if err != nil {
		t.Fatal(err)
	}
	sd.Signature = rawSign(t, p.attestKey, append(header, body...))
	return q
}

// collateralSpec says how the PKI's collateral differs from a platform
// in good standing.
type collateralSpec struct {
	tdxStatus, qeStatus string // "" is UpToDate
	revokePCK           bool
}

// collateral is the cache for this PKI's platform: Intel's real TCB info
// and QE identity, their TCB levels set to the real quote's and
// re-signed, and fresh CRLs.
func (p *testPKI) collateral(t *testing.T, spec collateralSpec) CollateralMap {
	t.Helper()
	realColl := realCollateral(t)
	fmspc := p.pckExt.FMSPC
	tcbChain := pemChain(p.tcbSigner, p.root)
	var revoked []x509.RevocationListEntry
	if spec.revokePCK {
		revoked = append(revoked, x509.RevocationListEntry{SerialNumber: p.pck.SerialNumber, RevocationTime: p.revokedAt})
	}
	return CollateralMap{
		"tcb-info-" + fmspc + ".json":             p.signedResponse(t, "tcbInfo", realColl["tcb-info-"+fmspc+".json"], p.tdxLevels(t, spec.tdxStatus)),
		"tcb-info-" + fmspc + ".issuer-chain.pem": tcbChain,
		"qe-identity.json":                        p.signedResponse(t, "enclaveIdentity", realColl["qe-identity.json"], qeLevels(spec.qeStatus)),
		"qe-identity.issuer-chain.pem":            tcbChain,
		"pck-crl-platform.der":                    p.crl(t, p.pckCA, p.pckCAKey, revoked),
		"pck-crl-platform.issuer-chain.pem":       pemChain(p.pckCA, p.root),
		"root-ca-crl.der":                         p.crl(t, p.root, p.rootKey, nil),
	}
}

// tdxLevels is one TCB level: exactly the real platform's SVNs.
func (p *testPKI) tdxLevels(t *testing.T, status string) []any {
	t.Helper()
	svns := func(b []byte) []any {
		out := make([]any, len(b))
		for i, v := range b {
			out[i] = map[string]any{"svn": v}
		}
		return out
	}
	return []any{map[string]any{
		"tcb": map[string]any{
			"sgxtcbcomponents": svns(p.pckExt.TCB.CPUSvnComponents),
			"pcesvn":           p.pckExt.TCB.PCESvn,
			"tdxtcbcomponents": svns(mustHex(t, realTEETCBSVN)),
		},
		"tcbDate":   "2023-02-15T00:00:00Z",
		"tcbStatus": statusOr(status),
	}}
}

// qeLevels is one QE TCB level, at the real QE's ISV SVN.
func qeLevels(status string) []any {
	return []any{map[string]any{"tcb": map[string]any{"isvsvn": 4}, "tcbDate": "2023-02-15T00:00:00Z", "tcbStatus": statusOr(status)}}
}

func statusOr(s string) string {
	if s == "" {
		return "UpToDate"
	}
	return s
}

// signedResponse is a PCS response whose member (tcbInfo or
// enclaveIdentity) is the real one with other TCB levels, signed with the
// PKI's TCB signing key.
func (p *testPKI) signedResponse(t *testing.T, member string, realBody []byte, levels []any) []byte {
	t.Helper()
	var outer map[string]json.RawMessage
	if err := json.Unmarshal(realBody, &outer); err != nil {
		t.Fatal(err)
	}
	var inner map[string]any
	dec := json.NewDecoder(bytes.NewReader(outer[member]))
	dec.UseNumber()
	if err := dec.Decode(&inner); err != nil {
		t.Fatal(err)
	}
	inner["tcbLevels"] = levels
	signed, err := json.Marshal(inner)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(map[string]any{member: json.RawMessage(signed), "signature": hex.EncodeToString(rawSign(t, p.tcbKey, signed))})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

func (p *testPKI) crl(t *testing.T, issuer *x509.Certificate, key *ecdsa.PrivateKey, revoked []x509.RevocationListEntry) []byte {
	t.Helper()
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{
		Number: big.NewInt(1), ThisUpdate: p.validFrom, NextUpdate: p.validTo, RevokedCertificateEntries: revoked,
	}, issuer, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}
