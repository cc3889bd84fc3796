package kubeadm

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/clusternet"
	"github.com/orrery-dev/orrery/internal/records/controlplanes"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
	"github.com/orrery-dev/orrery/internal/versions"
)

// A second control plane joins with what its join ticket holds and
// nothing else: the real kubeadm, given the configuration and discovery
// kubeconfig that Tool.Join writes, finds the cluster through the node's
// own client certificate (file discovery, no token), reads the cluster's
// configuration as that node, accepts the ticket's files as the shared
// control-plane certificates and makes the node's own certificates from
// them. Without one of the files it refuses, naming what is missing. The phases after
// the certificates write to /etc/kubernetes and start a kubelet; the
// end-to-end suite's nodes run those.
func TestControlPlaneJoinWithTheTicketsFiles(t *testing.T) {
	bin := apiservertest.Kubeadm(t)
	dir := t.TempDir()
	cluster := newKubeadmCluster(t, bin, dir)

	for name, tc := range map[string]struct {
		omit    string
		wantErr string
	}{
		"the ticket's files":              {},
		"without the etcd CA key":         {omit: "etcd/ca.key", wantErr: `key "etcd-ca"`},
		"without the service-account key": {omit: "sa.key", wantErr: "sa.key"},
	} {
		t.Run(name, func(t *testing.T) {
			pki := cluster.nodePKI
			os.RemoveAll(pki)
			for _, f := range controlplanes.PKIFiles {
				if f != tc.omit {
					copyFile(t, filepath.Join(cluster.firstPKI, f), filepath.Join(pki, f))
				}
			}
			nodeIP := netip.MustParseAddr("10.42.1.101")
			cert, key := cluster.nodeClientCert(t, "cp-1")
			var out bytes.Buffer
			tool := &Tool{Runner: phaseRunner{bin: bin}, ConfigDir: filepath.Join(t.TempDir(), "config")}
			err := tool.Join(context.Background(), JoinParams{
				NodeName: "cp-1", NodeIP: nodeIP, Endpoint: cluster.endpoint,
				CACert: cluster.ca.Raw, ClientCert: cert, ClientKey: key, ControlPlane: true,
			}, &out)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(out.String(), tc.wantErr) {
					t.Fatalf("err = %v, want kubeadm to refuse and name %s; output:\n%s", err, tc.wantErr, out.String())
				}
				return
			}
			if err != nil {
				t.Fatalf("kubeadm join phases: %v\n%s", err, out.String())
			}
			pool := x509.NewCertPool()
			pool.AddCert(cluster.ca)
			apiserver := readCert(t, filepath.Join(pki, "apiserver.crt"))
			if _, err := apiserver.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				t.Errorf("cp-1's API server certificate is not of the cluster CA: %v", err)
			}
			if !slices.ContainsFunc(apiserver.IPAddresses, func(ip net.IP) bool { return ip.Equal(nodeIP.AsSlice()) }) {
				t.Errorf("cp-1's API server certificate names %v, not its own address %s", apiserver.IPAddresses, nodeIP)
			}
			for _, f := range []string{"etcd/server.crt", "etcd/peer.crt", "apiserver-etcd-client.crt", "front-proxy-client.crt"} {
				if _, err := os.Stat(filepath.Join(pki, f)); err != nil {
					t.Errorf("kubeadm made no %s: %v", f, err)
				}
			}
		})
	}
}

// phaseRunner runs the phases of `kubeadm join` that need neither root's
// /etc/kubernetes nor a kubelet: preflight (discovery, the cluster's
// configuration, the shared certificates; the host's own checks are
// ignored, this is not a node) and the control-plane certificates.
type phaseRunner struct{ bin string }

func (r phaseRunner) Run(ctx context.Context, name string, args []string, _ io.Reader, out io.Writer) error {
	if name != "kubeadm" || len(args) != 3 || args[0] != "join" || args[1] != "--config" {
		return exec.ErrNotFound
	}
	for _, phase := range [][]string{
		{"preflight", "--ignore-preflight-errors=all"},
		{"control-plane-prepare", "certs"},
	} {
		argv := append(append([]string{"join", "phase"}, phase...), "--config", args[2])
		cmd := exec.CommandContext(ctx, r.bin, argv...)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			return err
		}
	}
	return nil
}

// kubeadmCluster is what `kubeadm init` leaves of a cluster for a joining
// control plane: the PKI, made by kubeadm from Orrery's init
// configuration, and the cluster's configuration uploaded to an API
// server of that CA, with the RBAC that lets nodes read it.
type kubeadmCluster struct {
	firstPKI, nodePKI string
	ca                *x509.Certificate
	caKey             crypto.Signer
	endpoint          string
}

func newKubeadmCluster(t *testing.T, bin, dir string) kubeadmCluster {
	t.Helper()
	c := kubeadmCluster{firstPKI: filepath.Join(dir, "cp-0-pki"), nodePKI: filepath.Join(dir, "cp-1-pki")}
	cfg, err := InitConfig(InitParams{NodeName: "cp-0", NodeIP: netip.MustParseAddr("10.42.1.100"),
		KubernetesVersion: versions.Default, ClusterName: "orrery", ServiceCIDR: clusternet.DefaultServiceCIDR, KubeletServingCA: true})
	if err != nil {
		t.Fatal(err)
	}
	// Both nodes keep their PKI in /etc/kubernetes/pki; here each has a
	// folder of its own, and the cluster's configuration names cp-1's.
	kubeadm := func(certDir string, args ...string) {
		path := filepath.Join(dir, "init.yaml")
		withDir := bytes.Replace(cfg, []byte("kind: ClusterConfiguration\n"), []byte("kind: ClusterConfiguration\ncertificatesDir: "+certDir+"\n"), 1)
		if err := os.WriteFile(path, withDir, 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(bin, append(args, "--config", path)...).CombinedOutput(); err != nil {
			t.Fatalf("kubeadm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	kubeadm(c.firstPKI, "init", "phase", "certs", "all")
	if err := EnsureKubeletServingCA(c.firstPKI, time.Now()); err != nil {
		t.Fatal(err)
	}
	c.ca = readCert(t, filepath.Join(c.firstPKI, "ca.crt"))
	c.caKey = readKey(t, filepath.Join(c.firstPKI, "ca.key"))
	srv := apiservertest.StartWithCA(t, c.ca, c.caKey)
	c.endpoint = strings.TrimPrefix(srv.Config.Host, "https://")
	kubeadm(c.nodePKI, "init", "phase", "upload-config", "all", "--kubeconfig", srv.Kubeconfig)
	return c
}

// nodeClientCert signs the client certificate the join service gives a
// node: system:node:<name> in system:nodes.
func (c kubeadmCluster) nodeClientCert(t *testing.T, name string) (der, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err = x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "system:node:" + name, Organization: []string{"system:nodes"}},
		NotBefore:    time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, c.ca, &key.PublicKey, c.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return der, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func readPEM(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	return block.Bytes
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	cert, err := x509.ParseCertificate(readPEM(t, path))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return cert
}

func readKey(t *testing.T, path string) crypto.Signer {
	t.Helper()
	key, err := x509.ParseECPrivateKey(readPEM(t, path))
	if err != nil {
		t.Fatalf("%s: %v (kubeadm makes ECDSA keys for Orrery, see encryptionAlgorithm)", path, err)
	}
	return key
}
