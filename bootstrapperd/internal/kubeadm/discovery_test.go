package kubeadm

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// testPKI is a cluster CA with an API server certificate for 127.0.0.1
// and a node's client certificate, as the join service issues it.
type testPKI struct {
	ca                   *x509.Certificate
	server               tls.Certificate
	nodeCert, nodeKeyPEM []byte
}

func newTestPKI(t testing.TB) testPKI {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(tmpl *x509.Certificate) ([]byte, *ecdsa.PrivateKey) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, key
	}
	srvDER, srvKey := issue(&x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	nodeDER, nodeKey := issue(&x509.Certificate{SerialNumber: big.NewInt(3),
		Subject: pkix.Name{CommonName: "system:node:w-0", Organization: []string{"system:nodes"}}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	keyDER, _ := x509.MarshalECPrivateKey(nodeKey)
	return testPKI{ca: ca, server: tls.Certificate{Certificate: [][]byte{srvDER}, PrivateKey: srvKey},
		nodeCert: nodeDER, nodeKeyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})}
}

func testJoinParams(t testing.TB) JoinParams {
	pki := newTestPKI(t)
	return JoinParams{NodeName: "w-0", NodeIP: netip.MustParseAddr("10.42.2.100"), Endpoint: "10.42.1.100:6443",
		CACert: pki.ca.Raw, ClientCert: pki.nodeCert, ClientKey: pki.nodeKeyPEM}
}

// The discovery kubeconfig is what kubeadm and kubelet will use: loaded
// with client-go, it reaches an API server of the cluster CA and presents
// the node's certificate, and it refuses a server of another CA.
func TestDiscoveryKubeconfigAuthenticatesAsTheNode(t *testing.T) {
	pki := newTestPKI(t)
	pool := x509.NewCertPool()
	pool.AddCert(pki.ca)
	var seen string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.PeerCertificates) > 0 {
			seen = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		io.WriteString(w, "{}")
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pki.server}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	defer srv.Close()

	p := JoinParams{Endpoint: strings.TrimPrefix(srv.URL, "https://"), CACert: pki.ca.Raw, ClientCert: pki.nodeCert, ClientKey: pki.nodeKeyPEM}
	raw, err := DiscoveryKubeconfig(p)
	if err != nil {
		t.Fatal(err)
	}
	get := func(raw []byte) error {
		cfg, err := clientcmd.Load(raw)
		if err != nil {
			t.Fatalf("kubeconfig does not load: %v", err)
		}
		rc, err := clientcmd.NewDefaultClientConfig(*cfg, nil).ClientConfig()
		if err != nil {
			t.Fatalf("kubeconfig has no usable context: %v", err)
		}
		hc, err := rest.HTTPClientFor(rc)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, rc.Host+"/version", nil)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get(raw); err != nil {
		t.Fatalf("the node could not reach the API server with its discovery kubeconfig: %v", err)
	}
	if seen != "system:node:w-0" {
		t.Fatalf("the API server saw client %q, want the node's certificate", seen)
	}

	// An API server whose certificate another CA signed is not trusted.
	other := newTestPKI(t)
	p.CACert = other.ca.Raw
	raw, _ = DiscoveryKubeconfig(p)
	if err := get(raw); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("an API server of another CA was trusted: %v", err)
	}
}

func TestDiscoveryKubeconfigRefusesBadInput(t *testing.T) {
	good := testJoinParams(t)
	for name, mutate := range map[string]func(*JoinParams){
		"no endpoint":         func(p *JoinParams) { p.Endpoint = "" },
		"no CA":               func(p *JoinParams) { p.CACert = nil },
		"garbage CA":          func(p *JoinParams) { p.CACert = []byte("not a certificate") },
		"truncated node cert": func(p *JoinParams) { p.ClientCert = p.ClientCert[:len(p.ClientCert)/2] },
		"no key":              func(p *JoinParams) { p.ClientKey = nil },
	} {
		p := good
		mutate(&p)
		if _, err := DiscoveryKubeconfig(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// Tool.Join hands kubeadm the discovery kubeconfig, which holds the
// node's key, and removes it afterwards.
func TestJoinWritesAndRemovesDiscoveryKubeconfig(t *testing.T) {
	dir := t.TempDir()
	var discovery string
	r := &fakeRunner{onRun: func(c call) error {
		raw, _ := os.ReadFile(c.args[2])
		discovery, _ = get(splitDocs(t, raw)[0], "discovery", "file", "kubeConfigPath").(string)
		fi, err := os.Stat(discovery)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("discovery kubeconfig %q: %v, mode %v", discovery, err, fi.Mode())
		}
		return nil
	}}
	tool := &Tool{Runner: r, ConfigDir: dir}
	if err := tool.Join(context.Background(), testJoinParams(t), io.Discard); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(discovery); !os.IsNotExist(err) {
		t.Fatalf("the discovery kubeconfig with the node's key is left behind: %v", err)
	}
}
