package tdx

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation/tdx/tdxtest"
)

// The tests re-sign the real quote under a test PKI (tdxtest.PKI), so that
// the real TD report body can be carried through every check to
// acceptance (Intel's collateral for the real platform refuses its TCB),
// and issue collateral and CRLs under it here, so that revocation and TCB
// status can be tested: Intel's real CRL and TCB info cannot be re-signed.

// newTestPKI is a test PKI valid at realTime, when the real collateral is.
func newTestPKI(t *testing.T) *tdxtest.PKI { return tdxtest.NewPKI(t, realTime) }

// revokedAt is when collateralSpec.revokePCK revokes the PCK certificate.
var revokedAt = realTime.AddDate(0, 0, -1)

// collateralSpec says how the PKI's collateral differs from a platform
// in good standing.
type collateralSpec struct {
	tdxStatus, qeStatus string // "" is UpToDate
	revokePCK           bool
}

// collateral is the cache for this PKI's platform: Intel's real TCB info
// and QE identity, their TCB levels set to the real quote's and
// re-signed, and fresh CRLs.
func collateralOf(t *testing.T, p *tdxtest.PKI, spec collateralSpec) CollateralMap {
	t.Helper()
	realColl := realCollateral(t)
	fmspc := p.PCKExtensions.FMSPC
	tcbChain := tdxtest.PEMChain(p.TCBSigner, p.Root)
	var revoked []x509.RevocationListEntry
	if spec.revokePCK {
		revoked = append(revoked, x509.RevocationListEntry{SerialNumber: p.PCK.SerialNumber, RevocationTime: revokedAt})
	}
	return CollateralMap{
		"tcb-info-" + fmspc + ".json":             signedResponse(t, p, "tcbInfo", realColl["tcb-info-"+fmspc+".json"], tdxLevels(t, p, spec.tdxStatus)),
		"tcb-info-" + fmspc + ".issuer-chain.pem": tcbChain,
		"qe-identity.json":                        signedResponse(t, p, "enclaveIdentity", realColl["qe-identity.json"], qeLevels(spec.qeStatus)),
		"qe-identity.issuer-chain.pem":            tcbChain,
		"pck-crl-platform.der":                    crl(t, p, p.PCKCA, p.PCKCAKey, revoked),
		"pck-crl-platform.issuer-chain.pem":       tdxtest.PEMChain(p.PCKCA, p.Root),
		"root-ca-crl.der":                         crl(t, p, p.Root, p.RootKey, nil),
	}
}

// tdxLevels is one TCB level: exactly the real platform's SVNs.
func tdxLevels(t *testing.T, p *tdxtest.PKI, status string) []any {
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
			"sgxtcbcomponents": svns(p.PCKExtensions.TCB.CPUSvnComponents),
			"pcesvn":           p.PCKExtensions.TCB.PCESvn,
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
func signedResponse(t *testing.T, p *tdxtest.PKI, member string, realBody []byte, levels []any) []byte {
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
	body, err := json.Marshal(map[string]any{member: json.RawMessage(signed), "signature": hex.EncodeToString(tdxtest.SignRaw(t, p.TCBKey, signed))})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

func crl(t *testing.T, p *tdxtest.PKI, issuer *x509.Certificate, key *ecdsa.PrivateKey, revoked []x509.RevocationListEntry) []byte {
	t.Helper()
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{
		Number: big.NewInt(1), ThisUpdate: p.ValidFrom, NextUpdate: p.ValidTo, RevokedCertificateEntries: revoked,
	}, issuer, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}
