// Package snpsim plays an AMD Secure Processor for machines that have
// none: it holds a test-only ARK, ASK and VCEK (made with go-sev-guest's
// test certificate builder) and signs SEV-SNP attestation reports with
// the VCEK. The local cloud uses it to make its VMs look like SEV-SNP
// confidential VMs, and tests use it to make reports no real CPU would.
//
// Whoever holds a Chip can sign any report: its root is trusted only by
// an owner whose policy names it as a test root (snp.TestRoot, with
// "notARealCpu": true), never in place of AMD's.
package snpsim

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha512"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	test "github.com/google/go-sev-guest/testing"

	"github.com/orrery-dev/orrery/internal/attestation/snp"
)

// Product is the CPU product the simulated chip claims to be.
const Product = "Milan-B1"

// milanB1FMS is CPUID 1 EAX of an AMD EPYC Milan B1 (family 19h, model
// 01h, stepping 1), which version 3 reports carry.
const milanB1FMS = 0x00a00f11

// Config describes a simulated chip.
type Config struct {
	// Keys are the ARK, ASK and VCEK keys. Nil makes fresh ones
	// (RSA-4096 for the ARK and ASK, P-384 for the VCEK, as AMD's).
	Keys *test.AmdKeys
	// ChipID names the chip; the VCEK certificate carries it.
	ChipID [abi.ChipIDSize]byte
	// TCB is the chip's firmware security patch level, reported in
	// every report and certified in the VCEK certificate.
	TCB kds.TCBParts
	// Now is when the certificates start being valid.
	Now time.Time
	// VCEKSerial is the VCEK certificate's serial number (0 if nil).
	VCEKSerial *big.Int
}

// Chip is a simulated AMD Secure Processor.
type Chip struct {
	signer *test.AmdSigner
	chipID [abi.ChipIDSize]byte
	tcb    kds.TCBVersion
}

// NewChip makes the chip's certificate chain.
func NewChip(cfg Config) (*Chip, error) {
	keys := cfg.Keys
	if keys == nil {
		var err error
		if keys, err = NewKeys(); err != nil {
			return nil, err
		}
	}
	tcb, err := kds.ComposeTCBParts(cfg.TCB)
	if err != nil {
		return nil, fmt.Errorf("chip TCB: %w", err)
	}
	b := &test.AmdSignerBuilder{
		Keys:             keys,
		ProductName:      Product,
		ArkCreationTime:  cfg.Now,
		AskCreationTime:  cfg.Now,
		AsvkCreationTime: cfg.Now,
		VcekCreationTime: cfg.Now,
		HWID:             cfg.ChipID,
		TCB:              tcb,
		VcekCustom: test.CertOverride{
			SerialNumber: cfg.VCEKSerial,
			Extensions:   test.CustomExtensions(cfg.TCB, cfg.ChipID[:], "", Product),
		},
	}
	signer, err := b.TestOnlyCertChain()
	if err != nil {
		return nil, fmt.Errorf("make the simulated chip's certificates: %w", err)
	}
	return &Chip{signer: signer, chipID: cfg.ChipID, tcb: tcb}, nil
}

// NewKeys makes fresh ARK, ASK, ASVK and VCEK keys.
func NewKeys() (*test.AmdKeys, error) {
	var k test.AmdKeys
	var err error
	for _, p := range []**rsa.PrivateKey{&k.Ark, &k.Ask, &k.Asvk} {
		if *p, err = rsa.GenerateKey(rand.Reader, 4096); err != nil {
			return nil, err
		}
	}
	if k.Vcek, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader); err != nil {
		return nil, err
	}
	return &k, nil
}

// TestRoot is the chip's root as an owner's policy names it.
func (c *Chip) TestRoot() snp.TestRoot {
	return snp.TestRoot{
		NotARealCPU: true,
		ARK:         string(pemCert(c.signer.Ark.Raw)),
		ASK:         string(pemCert(c.signer.Ask.Raw)),
	}
}

// VCEK is the chip's VCEK certificate.
func (c *Chip) VCEK() *x509.Certificate { return c.signer.Vcek }

// Guest is what a report says of the guest that asked for it.
type Guest struct {
	// Measurement is the launch measurement.
	Measurement [abi.MeasurementSize]byte
	// Policy is the guest policy the VM was launched with.
	Policy abi.SnpPolicy
	// HostData is what the host set at launch.
	HostData [abi.HostDataSize]byte
}

// Report signs a version 3 report for guest with reportData, and returns
// it with the VCEK, ASK and ARK certificates, as an SEV-SNP guest's
// extended report request returns them.
func (c *Chip) Report(guest Guest, reportData [abi.ReportDataSize]byte) (*spb.Attestation, error) {
	r := &spb.Report{
		Version:         abi.ReportVersion3,
		Policy:          abi.SnpPolicyToBytes(guest.Policy),
		SignatureAlgo:   abi.SignEcdsaP384Sha384,
		CurrentTcb:      uint64(c.tcb),
		ReportedTcb:     uint64(c.tcb),
		CommittedTcb:    uint64(c.tcb),
		LaunchTcb:       uint64(c.tcb),
		ReportData:      reportData[:],
		Measurement:     guest.Measurement[:],
		HostData:        guest.HostData[:],
		ChipId:          c.chipID[:],
		Cpuid1EaxFms:    milanB1FMS,
		CurrentMajor:    1,
		CurrentMinor:    55,
		CommittedMajor:  1,
		CommittedMinor:  55,
		CurrentBuild:    21,
		CommittedBuild:  21,
		FamilyId:        make([]byte, abi.FamilyIDSize),
		ImageId:         make([]byte, abi.ImageIDSize),
		IdKeyDigest:     make([]byte, abi.IDKeyDigestSize),
		AuthorKeyDigest: make([]byte, abi.AuthorKeyDigestSize),
		ReportId:        make([]byte, abi.ReportIDSize),
		ReportIdMa:      make([]byte, abi.ReportIDMASize),
		Signature:       make([]byte, abi.SignatureSize),
	}
	raw, err := abi.ReportToAbiBytes(r)
	if err != nil {
		return nil, fmt.Errorf("encode the simulated report: %w", err)
	}
	if err := c.sign(raw); err != nil {
		return nil, err
	}
	signed, err := abi.ReportToProto(raw)
	if err != nil {
		return nil, err
	}
	return &spb.Attestation{
		Report: signed,
		CertificateChain: &spb.CertificateChain{
			VcekCert: c.signer.Vcek.Raw,
			AskCert:  c.signer.Ask.Raw,
			ArkCert:  c.signer.Ark.Raw,
		},
	}, nil
}

// sign signs raw in place with the VCEK. It does not use the test
// builder's signer, whose randomness is fixed: two ECDSA signatures with
// a predictable nonce give the key away.
func (c *Chip) sign(raw []byte) error {
	digest := sha512.Sum384(abi.SignedComponent(raw))
	r, s, err := ecdsa.Sign(rand.Reader, c.signer.Keys.Vcek, digest[:])
	if err != nil {
		return fmt.Errorf("sign the simulated report: %w", err)
	}
	return abi.SetSignature(r, s, raw)
}

// CRLURL is where the chip's product CRL is published (the ASK names it).
func (c *Chip) CRLURL() string { return c.signer.Ask.CRLDistributionPoints[0] }

// CRL is a product CRL signed by the chip's ARK, valid from now for a
// week, that revokes the given serial numbers.
func (c *Chip) CRL(now time.Time, revoked ...*big.Int) ([]byte, error) {
	return c.crl(now, now.Add(7*24*time.Hour), revoked...)
}

func (c *Chip) crl(now, next time.Time, revoked ...*big.Int) ([]byte, error) {
	var entries []x509.RevocationListEntry
	for _, sn := range revoked {
		entries = append(entries, x509.RevocationListEntry{SerialNumber: sn, RevocationTime: now})
	}
	tmpl := &x509.RevocationList{
		SignatureAlgorithm:        x509.SHA384WithRSAPSS,
		Number:                    big.NewInt(now.Unix()),
		ThisUpdate:                now,
		NextUpdate:                next,
		RevokedCertificateEntries: entries,
		Issuer:                    pkix.Name{},
	}
	return x509.CreateRevocationList(rand.Reader, tmpl, c.signer.Ark, c.signer.Keys.Ark)
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// ExtendedReport is Report in the kernel's wire form for an extended
// report: the 1184-byte report followed by the certificate table.
func (c *Chip) ExtendedReport(guest Guest, reportData [abi.ReportDataSize]byte) ([]byte, error) {
	att, err := c.Report(guest, reportData)
	if err != nil {
		return nil, err
	}
	raw, err := abi.ReportToAbiBytes(att.GetReport())
	if err != nil {
		return nil, err
	}
	return append(raw, abi.CertsFromProto(att.GetCertificateChain()).Marshal()...), nil
}

// TestRootWithCRL is TestRoot with a CRL of the chip's ARK that revokes
// nothing, issued now and valid until the ARK expires: what the local
// cloud hands the owner. A verifier refuses a CRL past its nextUpdate,
// and this one also travels into a cluster's measurement sets, whose
// names cover it, so it cannot be refreshed there; a chip's CRL never
// revokes anything, so a long life costs nothing.
func (c *Chip) TestRootWithCRL(now time.Time) (snp.TestRoot, error) {
	der, err := c.crl(now, c.signer.Ark.NotAfter)
	if err != nil {
		return snp.TestRoot{}, err
	}
	r := c.TestRoot()
	r.CRL = string(pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der}))
	return r, nil
}
