package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func writeCA(t *testing.T, dir string, key any, keyPEMType string, keyDER []byte, pub any) {
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"}, IsCA: true,
		BasicConstraintsValid: true, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "ca.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(filepath.Join(dir, "ca.key"), pem.EncodeToMemory(&pem.Block{Type: keyPEMType, Bytes: keyDER}), 0o600)
}

func TestLoadClusterCA(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecDER, _ := x509.MarshalECPrivateKey(ecKey)
	pkcs8, _ := x509.MarshalPKCS8PrivateKey(ecKey)
	tests := map[string]func(dir string){
		// kubeadm writes RSA PKCS #1 keys by default.
		"RSA PKCS1": func(dir string) {
			writeCA(t, dir, rsaKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsaKey), &rsaKey.PublicKey)
		},
		"EC":     func(dir string) { writeCA(t, dir, ecKey, "EC PRIVATE KEY", ecDER, &ecKey.PublicKey) },
		"PKCS 8": func(dir string) { writeCA(t, dir, ecKey, "PRIVATE KEY", pkcs8, &ecKey.PublicKey) },
	}
	for name, write := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			write(dir)
			cert, key, err := loadClusterCA(dir)
			if err != nil || cert == nil || key == nil {
				t.Fatalf("loadClusterCA: %v", err)
			}
		})
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "ca.crt"), []byte("garbage"), 0o644)
	os.WriteFile(filepath.Join(dir, "ca.key"), []byte("garbage"), 0o600)
	if _, _, err := loadClusterCA(dir); err == nil {
		t.Fatal("garbage CA accepted")
	}
}

func TestReadSalt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "salt")
	os.WriteFile(path, []byte("AQID\n"), 0o644)
	if s, err := readSalt(path); err != nil || len(s) != 3 {
		t.Fatalf("readSalt = %v, %v", s, err)
	}
}
