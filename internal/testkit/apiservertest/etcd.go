package apiservertest

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// Etcd is a running etcd that, like a kubeadm control plane's, serves
// TLS and takes only clients with a certificate from its CA.
type Etcd struct {
	// Endpoint is its client address, HOST:PORT.
	Endpoint string
	// CACert, ClientCert and ClientKey are PEM files: its CA, and a
	// client's certificate and key issued by it.
	CACert, ClientCert, ClientKey string
	// Dir is etcd's data directory.
	Dir string
}

// StartEtcd runs etcd until the test ends. It skips the test when the
// binary is not built.
func StartEtcd(tb testing.TB) *Etcd {
	tb.Helper()
	bin, err := binDir()
	if err != nil {
		tb.Skip(err)
	}
	dir := tb.TempDir()
	ca, caKey := newCA(tb)
	serverCert, serverKey := signLeaf(tb, ca, caKey, &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "etcd"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	clientCert, clientKey := signLeaf(tb, ca, caKey, &x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "etcd-client"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	e := &Etcd{
		CACert: filepath.Join(dir, "ca.crt"), ClientCert: filepath.Join(dir, "client.crt"), ClientKey: filepath.Join(dir, "client.key"),
		Dir: filepath.Join(dir, "data"),
	}
	serverCertPath, serverKeyPath := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	for path, data := range map[string][]byte{
		e.CACert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}), e.ClientCert: clientCert, e.ClientKey: clientKey,
		serverCertPath: serverCert, serverKeyPath: serverKey,
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	client, peer := freePort(tb), freePort(tb)
	e.Endpoint = "127.0.0.1:" + strconv.Itoa(client)
	url, peerURL := "https://"+e.Endpoint, "http://127.0.0.1:"+strconv.Itoa(peer)
	start(tb, filepath.Join(bin, "etcd"), []string{
		"--data-dir=" + e.Dir,
		"--listen-client-urls=" + url, "--advertise-client-urls=" + url,
		"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=default=" + peerURL,
		"--cert-file=" + serverCertPath, "--key-file=" + serverKeyPath,
		"--client-cert-auth", "--trusted-ca-file=" + e.CACert,
		"--unsafe-no-fsync", "--log-level=warn",
	}, filepath.Join(dir, "etcd.log"))
	return e
}
