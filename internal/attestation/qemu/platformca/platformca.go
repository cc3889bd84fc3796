// Package platformca is the local cloud's platform CA: it certifies the
// attestation keys that the QEMU harness provisions into each VM's vTPM,
// the way a cloud provider certifies its vTPMs' keys. Verifiers (the CLI,
// the join service) trust attestations whose key chains to this CA, and so
// do joining nodes checking the join service: they read the CA from their
// own vTPM, where ProvisionAK publishes it.
package platformca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/orrery-dev/orrery/internal/attestation"
)

// File names inside a CA directory.
const (
	CertFile = "platform-ca.crt"
	KeyFile  = "platform-ca.key"
)

// NV indexes the attestation key is published at (those of GCE's ECC AK).
const (
	akTemplateNVIndex = tpmutil.Handle(client.GceAKTemplateNVIndexECC)
	akCertNVIndex     = tpmutil.Handle(client.GceAKCertNVIndexECC)
)

// CACertNVIndex is where ProvisionAK publishes the CA's own certificate, in
// the platform's NV range next to GCE's indexes (which hold no CA: GCE's
// roots are public and fixed). A node reads it to verify other nodes of
// the same platform (package qemu, ReadPlatformCA): the joining node
// checking the join service has no other copy of the local cloud's CA,
// which 'orrery mini up' makes per cloud, after the image is built.
const CACertNVIndex = 0x01c10100

// CA is a platform CA with its private key.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// New creates a CA valid for ten years from now.
func New(commonName string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate platform CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"Orrery local cloud"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create platform CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, key: key}, nil
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux.
	}
	return n
}

// Save writes the certificate (0644) and the key (0600) into dir.
func (ca *CA) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create platform CA directory: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return fmt.Errorf("encode platform CA key: %w", err)
	}
	if err := writeFile(filepath.Join(dir, KeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, CertFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}), 0o644)
}

func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Load reads a CA saved by Save.
func Load(dir string) (*CA, error) {
	cert, err := LoadCert(filepath.Join(dir, CertFile))
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(filepath.Join(dir, KeyFile))
	if err != nil {
		return nil, fmt.Errorf("read platform CA key: %w", err)
	}
	block, _ := pem.Decode(raw)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s: not a PEM private key", filepath.Join(dir, KeyFile))
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse platform CA key: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("%s does not hold the key of %s", KeyFile, CertFile)
	}
	return &CA{Cert: cert, key: key}, nil
}

// LoadCert reads a PEM CA certificate, which is all a verifier needs.
func LoadCert(path string) (*x509.Certificate, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read platform CA certificate: %w", err)
	}
	block, _ := pem.Decode(raw)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: not a PEM certificate", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse platform CA certificate %s: %w", path, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%s is not a CA certificate", path)
	}
	return cert, nil
}

// ProvisionAK acts as the cloud provider for one vTPM: it creates the
// attestation key in the endorsement hierarchy, certifies it as the key of
// instance inst (in its subject, see InstanceOf) and publishes the key's template and
// certificate in NV, and the CA's own certificate at CACertNVIndex.
// Running it again replaces both (the key itself is the same: it is
// derived from the TPM's endorsement seed and the template).
//
// The zero Instance certifies the key without naming an instance, as the
// local cloud did before it named them: only tests of such old VMs want
// that, since verifiers that need to know the node refuse its quotes.
func (ca *CA) ProvisionAK(rw io.ReadWriter, inst attestation.Instance) (*x509.Certificate, error) {
	subject := pkix.Name{CommonName: "Orrery local cloud vTPM attestation key"}
	if !inst.IsZero() {
		var err error
		if subject, err = instanceSubject(inst); err != nil {
			return nil, fmt.Errorf("certify attestation key: %w", err)
		}
	}
	tmpl := client.AKTemplateECC()
	tmplBytes, err := tmpl.Encode()
	if err != nil {
		return nil, fmt.Errorf("encode attestation key template: %w", err)
	}
	ak, err := client.NewKey(rw, tpm2.HandleEndorsement, tmpl)
	if err != nil {
		return nil, fmt.Errorf("create attestation key: %w", err)
	}
	akPub := ak.PublicKey()
	ak.Close()

	now := time.Now()
	certTmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      subject,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     ca.Cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, certTmpl, ca.Cert, akPub, ca.key)
	if err != nil {
		return nil, fmt.Errorf("certify attestation key: %w", err)
	}
	if err := writeNV(rw, akTemplateNVIndex, tmplBytes); err != nil {
		return nil, fmt.Errorf("publish attestation key template: %w", err)
	}
	if err := writeNV(rw, akCertNVIndex, der); err != nil {
		return nil, fmt.Errorf("publish attestation key certificate: %w", err)
	}
	if err := writeNV(rw, CACertNVIndex, ca.Cert.Raw); err != nil {
		return nil, fmt.Errorf("publish platform CA certificate: %w", err)
	}
	return x509.ParseCertificate(der)
}

// maxNVWrite is the largest chunk a TPM is guaranteed to accept in one
// NV_Write (MAX_NV_BUFFER_SIZE is at least 512 on PC Client TPMs).
const maxNVWrite = 512

func writeNV(rw io.ReadWriter, idx tpmutil.Handle, data []byte) error {
	if len(data) > 2048 {
		return fmt.Errorf("%d bytes exceed the NV index size limit", len(data))
	}
	// Replace whatever an earlier provisioning left there.
	if err := tpm2.NVUndefineSpace(rw, "", tpm2.HandleOwner, idx); err != nil && !isHandleMissing(err) {
		return fmt.Errorf("remove old NV index %#x: %w", uint32(idx), err)
	}
	attrs := tpm2.AttrOwnerWrite | tpm2.AttrOwnerRead | tpm2.AttrAuthRead | tpm2.AttrPPRead | tpm2.AttrNoDA
	if err := tpm2.NVDefineSpace(rw, tpm2.HandleOwner, idx, "", "", nil, attrs, uint16(len(data))); err != nil {
		return fmt.Errorf("define NV index %#x: %w", uint32(idx), err)
	}
	for off := 0; off < len(data); off += maxNVWrite {
		end := min(off+maxNVWrite, len(data))
		if err := tpm2.NVWrite(rw, tpm2.HandleOwner, idx, "", data[off:end], uint16(off)); err != nil {
			return fmt.Errorf("write NV index %#x: %w", uint32(idx), err)
		}
	}
	return nil
}

func isHandleMissing(err error) bool {
	var h tpm2.HandleError
	if errors.As(err, &h) && h.Code == tpm2.RCHandle {
		return true
	}
	var p tpm2.ParameterError
	return errors.As(err, &p) && p.Code == tpm2.RCHandle
}
