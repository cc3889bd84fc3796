package joinserver

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"log/slog"
	"maps"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/internal/records/controlplanes"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
	"github.com/orrery-dev/orrery/internal/records/removednodes"
	"github.com/orrery-dev/orrery/internal/testkit/syncbuffer"
	"github.com/orrery-dev/orrery/joinservice/internal/admissions"
	"github.com/orrery-dev/orrery/joinservice/internal/keyservice"
	"github.com/orrery-dev/orrery/joinservice/internal/setvalidator"
)

var master = keys.MasterSecret{Key: bytes.Repeat([]byte{1}, 32), Salt: bytes.Repeat([]byte{2}, 32)}

type localKeys struct{}

func (localKeys) GetDataKey(_ context.Context, id string, n int) ([]byte, error) {
	return keyservice.Derive(master, id, n)
}

// memNodes are the cluster's nodes; gone lists the ones the owner deleted.
type memNodes struct {
	mu   sync.Mutex
	gone map[string]bool
}

func (m *memNodes) NodeExists(_ context.Context, name string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.gone[name], nil
}

func (m *memNodes) delete(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gone[name] = true
}

func newCA(t testing.TB) (*x509.Certificate, *ecdsa.PrivateKey) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert, key
}

func csr(t *testing.T, cn string, org []string) []byte {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	return csrWithKey(t, cn, org, key)
}

func csrWithKey(t testing.TB, cn string, org []string, key crypto.Signer) []byte {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: cn, Organization: org}, DNSNames: []string{"worker-0"}, IPAddresses: []net.IP{net.ParseIP("10.42.2.100")},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// memSets are the cluster's accepted measurement sets, and its clock.
type memSets struct {
	mu   sync.Mutex
	sets []measurementset.Set
	now  time.Time
}

func (m *memSets) source(context.Context) ([]measurementset.Set, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sets, nil
}

func (m *memSets) clock() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// change replaces the accepted sets and lets d pass.
func (m *memSets) change(sets []measurementset.Set, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if sets != nil {
		m.sets = sets
	}
	m.now = m.now.Add(d)
}

// imageSet is an accepted set whose PCR 4 is pcr4; a fresh swtpm's is zero.
func imageSet(t *testing.T, pcr4 byte) measurementset.Set {
	t.Helper()
	s, err := measurementset.New(measurements.M{4: {Expected: bytes.Repeat([]byte{pcr4}, 32)}}, "")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type env struct {
	ca         *x509.Certificate
	admissions *admissions.Memory
	nodes      *memNodes
	// removed is the owner's list of removed nodes the server reads.
	removed   removednodes.List
	removedMu sync.Mutex
	node      *qemutest.Node
	logs      *syncbuffer.Buffer
	// sets are the accepted measurement sets, at first imageA, which the
	// nodes match.
	sets     *memSets
	imageA   string
	attested joinpb.JoinServiceClient
	// other is another VM of the same platform, worker-1, attested.
	other joinpb.JoinServiceClient
	plain joinpb.JoinServiceClient
}

// envOptions shape newEnv's node and join service.
type envOptions struct {
	// instance is what the node's AK certificate names; nil means a
	// fresh instance called qemutest.DefaultName, and a pointer to the
	// zero Instance an AK certificate from before instance identities.
	instance *attestation.Instance
	// approveNode puts the node's instance ID on the approved
	// control-plane list (which also holds an unrelated ID).
	approveNode bool
	// controlPlanesErr, if set, is what reading that list fails with.
	controlPlanesErr error
	// versionErr, if set, is what reading the cluster's Kubernetes
	// version fails with.
	versionErr error
	// controlPlanes, if set, is what the control planes' kubelets report.
	controlPlanes func() ([]string, error)
}

// clusterVersion is the Kubernetes version the test's cluster runs.
const clusterVersion = "v1.37.2"

// newEnv serves the join service twice: over attested TLS (the node's
// swtpm attests, through the same validator the join service uses: the
// cluster's sets, e.sets) and, to check the server's own guard, without
// it.
func newEnv(t *testing.T, opts envOptions) *env {
	ca, caKey := newCA(t)
	pki := newPKIDir(t)
	imageA := imageSet(t, 0)
	e := &env{
		ca: ca, admissions: &admissions.Memory{}, nodes: &memNodes{gone: map[string]bool{}}, logs: &syncbuffer.Buffer{},
		sets: &memSets{sets: []measurementset.Set{imageA}, now: time.Unix(1000, 0)}, imageA: imageA.Name,
	}
	pca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	inst := platformca.NewInstance(qemutest.DefaultName)
	if opts.instance != nil {
		inst = *opts.instance
	}
	node := qemutest.NewInstance(t, pca, inst)
	e.node = node
	approved := "4242424242 # another control plane\n"
	if opts.approveNode {
		approved += node.Instance.ID + "\n"
	}
	val, err := setvalidator.New(setvalidator.Config{
		Variant: variant.QEMUVTPM,
		Build: func(p policy.Policy) (attestation.Validator, error) {
			return qemu.NewValidator(qemu.ValidatorConfig{Measurements: p.PCRs, PlatformCAs: []*x509.Certificate{pca.Cert}})
		},
		Source: e.sets.source,
		Now:    e.sets.clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{
		Keys: localKeys{}, Admissions: e.admissions, Nodes: e.nodes, CurrentSet: val.Current, CA: ca, CAKey: caKey, PKIDir: pki,
		Endpoint: "10.42.1.100:6443",
		Reserved: func(context.Context) (Reserved, error) {
			return Reserved{Networks: []Network{
				{"the Service network", netip.MustParsePrefix("10.96.0.0/12")}, {"the pod network", netip.MustParsePrefix("10.244.0.0/16")},
				{"an address of the API server's certificate", netip.MustParsePrefix("10.42.7.7/32")},
			}, Names: []string{"api.example.org"}}, nil
		},
		ClusterVersion: func(context.Context) (string, error) { return clusterVersion, opts.versionErr },
		ControlPlaneVersions: func(context.Context) ([]string, error) {
			if opts.controlPlanes == nil {
				return []string{clusterVersion}, nil
			}
			return opts.controlPlanes()
		},
		MeasurementSalt: func(context.Context) ([]byte, error) { return bytes.Repeat([]byte{3}, 32), nil },
		ControlPlanes: func(context.Context) ([]string, error) {
			if opts.controlPlanesErr != nil {
				return nil, opts.controlPlanesErr
			}
			return controlplanes.Parse(approved)
		},
		Removed: func(context.Context) (removednodes.List, error) {
			e.removedMu.Lock()
			defer e.removedMu.Unlock()
			return maps.Clone(e.removed), nil
		},
		Logger: slog.New(slog.NewTextHandler(e.logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	iss := node.Issuer
	serverCreds, _ := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{val}})
	clientCreds, _ := atls.NewCredentials(atls.Config{Issuer: iss})

	attestedAddr := serveJoinService(t, srv, grpc.Creds(serverCreds))
	e.attested = dialJoinService(t, attestedAddr, grpc.WithTransportCredentials(clientCreds))
	other := qemutest.NewInstance(t, pca, platformca.NewInstance("worker-1"))
	otherCreds, _ := atls.NewCredentials(atls.Config{Issuer: other.Issuer})
	e.other = dialJoinService(t, attestedAddr, grpc.WithTransportCredentials(otherCreds))
	e.plain = dialJoinService(t, serveJoinService(t, srv), grpc.WithTransportCredentials(insecure.NewCredentials()))
	return e
}

// newPKIDir is a kubeadm certificate directory holding every file the
// join service hands an approved control plane.
func newPKIDir(t *testing.T) string {
	t.Helper()
	pki := t.TempDir()
	for _, f := range controlplanes.PKIFiles {
		os.MkdirAll(filepath.Dir(filepath.Join(pki, f)), 0o700)
		os.WriteFile(filepath.Join(pki, f), []byte("content of "+f), 0o600)
	}
	return pki
}

// serveJoinService serves srv on a local port until the test ends and
// returns its address.
func serveJoinService(t *testing.T, srv joinpb.JoinServiceServer, opts ...grpc.ServerOption) string {
	t.Helper()
	g := grpc.NewServer(opts...)
	joinpb.RegisterJoinServiceServer(g, srv)
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

func dialJoinService(t *testing.T, addr string, opt grpc.DialOption) joinpb.JoinServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return joinpb.NewJoinServiceClient(conn)
}

const uuid = "0B5C1F3E-8D2A-4C6B-9E7F-1A2B3C4D5E6F"

func TestJoinTicket(t *testing.T) {
	e := newEnv(t, envOptions{approveNode: true})
	ctx := context.Background()
	for _, cp := range []bool{false, true} {
		resp, err := e.attested.IssueJoinTicket(ctx, &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
			DiskUuid: uuid, CertificateRequest: csr(t, "system:node:worker-0", []string{"system:nodes"}), IsControlPlane: cp,
		})
		if err != nil {
			t.Fatalf("control plane %v: %v", cp, err)
		}
		wantDisk, _ := master.DiskKey(strings.ToLower(uuid))
		wantMS, _ := master.MeasurementSecret()
		if !bytes.Equal(resp.GetStateDiskKey(), wantDisk) || !bytes.Equal(resp.GetMeasurementSecret(), wantMS) {
			t.Fatal("ticket carries the wrong disk key or measurement secret")
		}
		// The node learns the public half of the owner's access key,
		// so that it answers its owner, and nothing more of it.
		owner, _ := master.OwnerAccessKey()
		if got := resp.GetOwnerAccessKey(); !bytes.Equal(got, owner.Public().(ed25519.PublicKey)) {
			t.Fatalf("ticket carries owner access key %x, want the owner's public key %x", got, owner.Public())
		}
		checkKubeletCert(t, e.ca, resp.GetKubeletCert(), "worker-0")
		// The node trusts the API server through the cluster CA, and
		// joins with the certificate above: no bootstrap token, which
		// would let it ask for any node's certificate.
		if !bytes.Equal(resp.GetClusterCaCert(), e.ca.Raw) || resp.GetApiServerEndpoint() != "10.42.1.100:6443" {
			t.Fatalf("ticket: cluster CA %d bytes (want the CA's %d), endpoint %q", len(resp.GetClusterCaCert()), len(e.ca.Raw), resp.GetApiServerEndpoint())
		}
		if got := len(resp.GetControlPlaneFiles()); (got > 0) != cp || (cp && got != len(controlplanes.PKIFiles)) {
			t.Fatalf("control plane %v: %d files", cp, got)
		}
		// The node runs the release the cluster runs now.
		if got := resp.GetKubernetesVersion(); got != clusterVersion {
			t.Fatalf("ticket names Kubernetes %q, want the cluster's %s", got, clusterVersion)
		}
	}
}

// A join service that cannot read the cluster's Kubernetes version gives
// no ticket, and admits no disk: a node must never join with a version it
// guessed.
func TestNoTicketWithoutTheClusterVersion(t *testing.T) {
	e := newEnv(t, envOptions{versionErr: errors.New("kube-system/kubeadm-config: forbidden")})
	ctx := context.Background()
	_, err := e.attested.IssueJoinTicket(ctx, &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
		DiskUuid: uuid, CertificateRequest: csr(t, "system:node:worker-0", []string{"system:nodes"}),
	})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "read the cluster's Kubernetes version: kube-system/kubeadm-config: forbidden") {
		t.Fatalf("join ticket without the cluster's version: %v, want Unavailable naming the cause", err)
	}
	if _, found, _ := e.admissions.Lookup(ctx, strings.ToLower(uuid)); found {
		t.Fatal("the refused join admitted the disk")
	}
	if err := e.admissions.Admit(ctx, admitted.Record{DiskUUID: strings.ToLower(uuid), Instance: e.node.Instance, MeasurementSet: e.imageA}); err != nil {
		t.Fatal(err)
	}
	resp, err := e.attested.IssueRejoinTicket(ctx, &joinpb.IssueRejoinTicketRequest{DiskUuid: uuid})
	if status.Code(err) != codes.Unavailable || len(resp.GetStateDiskKey()) > 0 {
		t.Fatalf("rejoin ticket without the cluster's version: %v, want Unavailable and no key", err)
	}
}

// An upgrade moved kubeadm's record to v1.37.2 and cp-0, but cp-1 still
// runs v1.36.3: a node the host reboots now gets v1.36.3, not a kubelet
// newer than cp-1's API server. Once every control plane runs v1.37.2,
// tickets name it. Control planes that cannot be read refuse the ticket.
func TestTicketsWaitForEveryControlPlane(t *testing.T) {
	var mu sync.Mutex
	cps, cpErr := []string{"v1.37.2", "v1.36.3"}, error(nil)
	e := newEnv(t, envOptions{controlPlanes: func() ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(cps), cpErr
	}})
	ctx := context.Background()
	join := func() (*joinpb.IssueJoinTicketResponse, error) {
		return e.attested.IssueJoinTicket(ctx, &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
			DiskUuid: uuid, CertificateRequest: csr(t, "system:node:"+qemutest.DefaultName, []string{"system:nodes"})})
	}
	resp, err := join()
	if err != nil || resp.GetKubernetesVersion() != "v1.36.3" || len(resp.GetKubernetesComponents()) == 0 {
		t.Fatalf("ticket during the upgrade: %q (%d components), %v; want v1.36.3, cp-1's", resp.GetKubernetesVersion(), len(resp.GetKubernetesComponents()), err)
	}
	rejoin, err := e.attested.IssueRejoinTicket(ctx, &joinpb.IssueRejoinTicketRequest{DiskUuid: uuid})
	if err != nil || rejoin.GetKubernetesVersion() != "v1.36.3" {
		t.Fatalf("rejoin ticket during the upgrade: %q, %v; want v1.36.3", rejoin.GetKubernetesVersion(), err)
	}
	mu.Lock()
	cps = []string{"v1.37.2", "v1.37.2"}
	mu.Unlock()
	if rejoin, err := e.attested.IssueRejoinTicket(ctx, &joinpb.IssueRejoinTicketRequest{DiskUuid: uuid}); err != nil || rejoin.GetKubernetesVersion() != clusterVersion {
		t.Fatalf("rejoin ticket after the upgrade: %q, %v; want %s", rejoin.GetKubernetesVersion(), err, clusterVersion)
	}
	mu.Lock()
	cpErr = errors.New("nodes is forbidden")
	mu.Unlock()
	if _, err := e.attested.IssueRejoinTicket(ctx, &joinpb.IssueRejoinTicketRequest{DiskUuid: uuid}); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "control planes' Kubernetes versions") {
		t.Fatalf("rejoin ticket without the control planes' versions: %v, want Unavailable", err)
	}
}

// checkKubeletCert checks that der is a client certificate of the cluster
// CA for node name and nothing else.
func checkKubeletCert(t *testing.T, ca *x509.Certificate, der []byte, name string) {
	t.Helper()
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("kubelet certificate is not a client certificate of the cluster CA: %v", err)
	}
	if cert.Subject.CommonName != "system:node:"+name || !slices.Equal(cert.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("kubelet certificate subject %v, want CN system:node:%s, O system:nodes", cert.Subject, name)
	}
	if !slices.Equal(cert.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) || len(cert.UnknownExtKeyUsage) > 0 {
		t.Errorf("kubelet certificate extended key usages %v %v, want client auth only", cert.ExtKeyUsage, cert.UnknownExtKeyUsage)
	}
	if len(cert.DNSNames)+len(cert.IPAddresses)+len(cert.EmailAddresses)+len(cert.URIs) > 0 {
		t.Errorf("kubelet certificate has subject alternative names %v %v %v %v, want none", cert.DNSNames, cert.IPAddresses, cert.EmailAddresses, cert.URIs)
	}
	if cert.IsCA || cert.KeyUsage&^x509.KeyUsageDigitalSignature != 0 {
		t.Errorf("kubelet certificate: CA %v, key usage %#x", cert.IsCA, cert.KeyUsage)
	}
}

func TestJoinRefusals(t *testing.T) {
	e := newEnv(t, envOptions{})
	weakRSA, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	good := csr(t, "system:node:worker-0", []string{"system:nodes"})
	tests := map[string]struct {
		client   joinpb.JoinServiceClient
		req      *joinpb.IssueJoinTicketRequest
		wantCode codes.Code
		wantMsg  string
	}{
		"unattested caller": {e.plain, &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs, DiskUuid: uuid, CertificateRequest: good}, codes.PermissionDenied, "did not attest"},
		"bad disk UUID":     {e.attested, &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs, DiskUuid: "nope", CertificateRequest: good}, codes.InvalidArgument, "malformed"},
		"no CSR":            {e.attested, &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs, DiskUuid: uuid}, codes.InvalidArgument, "missing"},
		"garbage CSR":       {e.attested, &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs, DiskUuid: uuid, CertificateRequest: []byte("garbage")}, codes.InvalidArgument, "not a DER"},
		"truncated CSR":     {e.attested, &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs, DiskUuid: uuid, CertificateRequest: good[:len(good)/2]}, codes.InvalidArgument, "not a DER"},
		"wrong CN": {e.attested, &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs, DiskUuid: uuid, CertificateRequest: csr(t, "admin", []string{"system:nodes"})},
			codes.InvalidArgument, "system:node:"},
		"node name Kubernetes refuses": {e.attested, &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs, DiskUuid: uuid, CertificateRequest: csr(t, "system:node:Worker_0", []string{"system:nodes"})},
			codes.InvalidArgument, "DNS subdomain"},
		"weak RSA key": {e.attested, &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs, DiskUuid: uuid, CertificateRequest: csrWithKey(t, "system:node:worker-0", []string{"system:nodes"}, weakRSA)},
			codes.InvalidArgument, "RSA key of 1024 bits"},
		"wrong group": {e.attested, &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs, DiskUuid: uuid, CertificateRequest: csr(t, "system:node:x", []string{"system:masters"})},
			codes.InvalidArgument, "organization"},
		"no address": {e.attested, &joinpb.IssueJoinTicketRequest{DiskUuid: uuid, CertificateRequest: good},
			codes.InvalidArgument, "states no node address"},
		"loopback address": {e.attested, &joinpb.IssueJoinTicketRequest{NodeAddresses: []string{"127.0.0.1"}, DiskUuid: uuid, CertificateRequest: good},
			codes.InvalidArgument, "127.0.0.1 is not one"},
		"address not an address": {e.attested, &joinpb.IssueJoinTicketRequest{NodeAddresses: []string{"worker-1.example"}, DiskUuid: uuid, CertificateRequest: good},
			codes.InvalidArgument, "worker-1.example"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := tc.client.IssueJoinTicket(context.Background(), tc.req)
			if status.Code(err) != tc.wantCode || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.wantCode, tc.wantMsg)
			}
		})
	}
	if _, err := e.plain.IssueRejoinTicket(context.Background(), &joinpb.IssueRejoinTicketRequest{DiskUuid: uuid}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("unattested rejoin: %v", err)
	}
}

func TestRejoinTicket(t *testing.T) {
	e := newEnv(t, envOptions{})
	if _, err := e.attested.IssueJoinTicket(context.Background(), &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
		DiskUuid: uuid, CertificateRequest: csr(t, "system:node:worker-0", []string{"system:nodes"}),
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := e.attested.IssueRejoinTicket(context.Background(), &joinpb.IssueRejoinTicketRequest{DiskUuid: strings.ToLower(uuid)})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := master.DiskKey(uuid)
	if !bytes.Equal(resp.GetStateDiskKey(), want) {
		t.Fatal("rejoin ticket has another disk key than the join ticket")
	}
	// What the initrd checks the kept Kubernetes files against: the
	// same CA and endpoint a join ticket carries.
	if !bytes.Equal(resp.GetClusterCaCert(), e.ca.Raw) || resp.GetApiServerEndpoint() != "10.42.1.100:6443" {
		t.Fatalf("rejoin ticket: cluster CA %d bytes (want the CA's %d), endpoint %q", len(resp.GetClusterCaCert()), len(e.ca.Raw), resp.GetApiServerEndpoint())
	}
	if got := resp.GetKubernetesVersion(); got != clusterVersion {
		t.Fatalf("rejoin ticket names Kubernetes %q, want the cluster's %s", got, clusterVersion)
	}

	// The owner removes the node ('kubectl delete node'): no more rejoins.
	e.nodes.delete(qemutest.DefaultName)
	resp, err = e.attested.IssueRejoinTicket(context.Background(), &joinpb.IssueRejoinTicketRequest{DiskUuid: uuid})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "removed from the cluster") || len(resp.GetStateDiskKey()) > 0 {
		t.Fatalf("rejoin of a removed node: err = %v, want PermissionDenied", err)
	}
	if !strings.Contains(e.logs.String(), "refused a rejoin: the owner removed the node") || !strings.Contains(e.logs.String(), "node="+qemutest.DefaultName) {
		t.Errorf("refusal not logged with the node's name:\n%s", e.logs)
	}
}

// A rejoin ticket says whether the node is a control plane from the
// owner's list, not from anything the node says; a list the join service
// cannot read refuses the rejoin rather than guess.
// nodeAddrs are the addresses the test's node states when it joins.
var nodeAddrs = []string{"10.42.1.0"}

// Root on one node joins a second VM under its neighbour's address, to
// get its kubelet a serving certificate for that address: refused, and
// nothing is recorded for the disk. Once the owner removed the
// neighbour, its address is still refused while the neighbour's serving
// certificate for it may be valid, and free after.
func TestJoinWithAnotherNodesAddress(t *testing.T) {
	e := newEnv(t, envOptions{})
	ctx := context.Background()
	neighbour := admitted.Record{DiskUUID: "22222222-2222-2222-2222-222222222222", Instance: attestation.Instance{Name: "worker-1", ID: "neighbour"},
		Addresses: []netip.Addr{netip.MustParseAddr("10.42.1.1")}}
	if err := e.admissions.Admit(ctx, neighbour); err != nil {
		t.Fatal(err)
	}
	req := &joinpb.IssueJoinTicketRequest{NodeAddresses: []string{"10.42.1.1"}, DiskUuid: uuid, CertificateRequest: csr(t, "system:node:worker-0", []string{"system:nodes"})}
	_, err := e.attested.IssueJoinTicket(ctx, req)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "10.42.1.1 belongs to worker-1") {
		t.Fatalf("join with worker-1's address: %v, want PermissionDenied naming it", err)
	}
	if _, found, _ := e.admissions.Lookup(ctx, uuid); found {
		t.Fatal("the refused join's disk was recorded")
	}
	removedAt := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	e.admissions.Remove(neighbour.DiskUUID, removedAt.Format(time.RFC3339))
	now := removedAt.Add(admitted.KubeletCertLifetime - time.Minute)
	e.admissions.Now = func() time.Time { return now }
	_, err = e.attested.IssueJoinTicket(ctx, req)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "which the owner removed at 2026-11-30T10:00:00Z") || !strings.Contains(err.Error(), "valid until 2026-12-07T10:00:00Z") {
		t.Fatalf("join with the address of a node removed 167 h ago: %v, want PermissionDenied saying until when it is held", err)
	}
	now = removedAt.Add(admitted.KubeletCertLifetime)
	if _, err := e.attested.IssueJoinTicket(ctx, req); err != nil {
		t.Fatalf("join with the address of a node removed a certificate's lifetime ago: %v", err)
	}
	rec, _, _ := e.admissions.Lookup(ctx, uuid)
	if len(rec.Addresses) != 1 || rec.Addresses[0] != netip.MustParseAddr("10.42.1.1") {
		t.Fatalf("the record holds addresses %v", rec.Addresses)
	}
}

func TestRejoinTicketControlPlane(t *testing.T) {
	tests := map[string]struct {
		opts             envOptions
		wantControlPlane bool
		wantCode         codes.Code
	}{
		"approved instance":   {opts: envOptions{approveNode: true}, wantControlPlane: true},
		"another instance":    {opts: envOptions{}},
		"list cannot be read": {opts: envOptions{controlPlanesErr: errors.New("configmap: connection refused")}, wantCode: codes.Unavailable},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, tc.opts)
			if _, err := e.attested.IssueJoinTicket(context.Background(), &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
				DiskUuid: uuid, CertificateRequest: csr(t, "system:node:worker-0", []string{"system:nodes"}),
			}); err != nil {
				t.Fatal(err)
			}
			resp, err := e.attested.IssueRejoinTicket(context.Background(), &joinpb.IssueRejoinTicketRequest{DiskUuid: uuid})
			if status.Code(err) != tc.wantCode {
				t.Fatalf("err = %v, want %v", err, tc.wantCode)
			}
			if err != nil {
				if !strings.Contains(err.Error(), "connection refused") || len(resp.GetStateDiskKey()) > 0 {
					t.Fatalf("err = %v, want the list's error and no key", err)
				}
				if !strings.Contains(e.logs.String(), "cannot read the approved control planes") {
					t.Errorf("failure not logged:\n%s", e.logs)
				}
				return
			}
			if resp.GetControlPlane() != tc.wantControlPlane {
				t.Errorf("control_plane = %v, want %v", resp.GetControlPlane(), tc.wantControlPlane)
			}
		})
	}
}

// A node the owner removed ('orrery node remove': its disk's record
// marked removed, its name and instance on the removed list) gets nothing
// again: not a rejoin with its old disk, even with its Node re-created by
// its old kubelet certificate, and not a join with a blank disk.
func TestRemovedNodeGetsNoTicket(t *testing.T) {
	const otherDisk = "11111111-2222-3333-4444-555555555555"
	join := func(e *env, disk string) error {
		_, err := e.attested.IssueJoinTicket(context.Background(), &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
			DiskUuid: disk, CertificateRequest: csr(t, "system:node:"+qemutest.DefaultName, []string{"system:nodes"}),
		})
		return err
	}
	rejoin := func(e *env, disk string) error {
		_, err := e.attested.IssueRejoinTicket(context.Background(), &joinpb.IssueRejoinTicketRequest{DiskUuid: disk})
		return err
	}
	removedAt := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	tests := map[string]struct {
		// remove marks what the owner's removal left: the disk's record,
		// the list, or both.
		record, listName, listInstance bool
		try                            func(e *env) error
		wantMsg                        string
	}{
		"rejoin with the record removed": {record: true, try: func(e *env) error { return rejoin(e, uuid) }, wantMsg: "gets no rejoin ticket, for good"},
		"join again with the removed disk": {record: true, try: func(e *env) error { return join(e, uuid) },
			wantMsg: "removed the disk's node"},
		"rejoin when listed by name":         {listName: true, try: func(e *env) error { return rejoin(e, uuid) }, wantMsg: "a removed node gets no ticket again"},
		"join with a blank disk when listed": {listInstance: true, try: func(e *env) error { return join(e, otherDisk) }, wantMsg: "a removed node gets no ticket again"},
		"rejoin when listed by instance": {listInstance: true, try: func(e *env) error { return rejoin(e, uuid) },
			wantMsg: "orrery node remove"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, envOptions{})
			if err := join(e, uuid); err != nil {
				t.Fatal(err)
			}
			if tc.record {
				e.admissions.Remove(uuid, removedAt.Format(time.RFC3339))
			}
			e.removedMu.Lock()
			e.removed = removednodes.List{}
			if tc.listName {
				e.removed[qemutest.DefaultName] = removednodes.Entry{RemovedAt: removedAt}
			}
			if tc.listInstance {
				e.removed["old-name"] = removednodes.Entry{InstanceID: e.node.Instance.ID, RemovedAt: removedAt}
			}
			e.removedMu.Unlock()
			// The Node still exists: its old kubelet re-created it.
			err := tc.try(e)
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("err = %v, want PermissionDenied containing %q", err, tc.wantMsg)
			}
			if !strings.Contains(e.logs.String(), "the owner removed") {
				t.Errorf("refusal not logged:\n%s", e.logs)
			}
		})
	}
	// Another node is not affected by the list.
	e := newEnv(t, envOptions{})
	e.removedMu.Lock()
	e.removed = removednodes.List{"worker-9": {InstanceID: "99", RemovedAt: removedAt}}
	e.removedMu.Unlock()
	if err := join(e, uuid); err != nil {
		t.Fatalf("a node that is not on the removed list: %v", err)
	}
}

func TestNewRequiresAdmissionsAndCA(t *testing.T) {
	if _, err := New(Config{CA: &x509.Certificate{}, CAKey: &ecdsa.PrivateKey{}}); err == nil {
		t.Fatal("a join server without a record of admitted disks was created")
	}
	if _, err := New(Config{Admissions: &admissions.Memory{}, Nodes: &memNodes{}}); err == nil {
		t.Fatal("a join server without the cluster CA was created")
	}
	if _, err := New(Config{CA: &x509.Certificate{}, CAKey: &ecdsa.PrivateKey{}, Admissions: &admissions.Memory{}}); err == nil {
		t.Fatal("a join server without a view of the nodes was created")
	}
	if _, err := New(Config{CA: &x509.Certificate{}, CAKey: &ecdsa.PrivateKey{}, Admissions: &admissions.Memory{}, Nodes: &memNodes{},
		CurrentSet: func(context.Context, []byte) (string, error) { return "", nil }}); err == nil || !strings.Contains(err.Error(), "ClusterVersion") {
		t.Fatalf("a join server without a view of the cluster's Kubernetes version: %v", err)
	}
}

// FuzzCheckCSR feeds arbitrary bytes as the kubelet CSR, the one blob in a
// join request that the join service parses itself: no panic, and whatever
// it accepts asks for a node's identity with a key the CA may sign.
func FuzzCheckCSR(f *testing.F) {
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	good := csrWithKey(f, "system:node:worker-0", []string{"system:nodes"}, ecKey)
	f.Add(good)
	f.Add(csrWithKey(f, "system:node:cp-0", []string{"system:nodes"}, edKey))
	f.Add(csrWithKey(f, "admin", []string{"system:masters"}, ecKey))
	f.Add(good[:len(good)/2])
	f.Add([]byte{})
	ca, caKey := newCA(f)
	s, err := New(Config{CA: ca, CAKey: caKey, Admissions: &admissions.Memory{}, Nodes: &memNodes{},
		CurrentSet:     func(context.Context, []byte) (string, error) { return "", nil },
		ClusterVersion: func(context.Context) (string, error) { return clusterVersion, nil }})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, der []byte) {
		csr, name, err := checkCSR(der)
		if err != nil {
			if csr != nil || name != "" {
				t.Fatalf("refused (%v) but returned %v, %q", err, csr, name)
			}
			return
		}
		if csr.Subject.CommonName != "system:node:"+name || !slices.Equal(csr.Subject.Organization, []string{"system:nodes"}) {
			t.Fatalf("accepted subject %v", csr.Subject)
		}
		cert, err := s.signKubeletCert(name, csr.PublicKey)
		if err != nil {
			t.Fatalf("accepted a CSR the CA cannot sign: %v", err)
		}
		parsed, err := x509.ParseCertificate(cert)
		if err != nil || parsed.IsCA || parsed.Subject.CommonName != csr.Subject.CommonName {
			t.Fatalf("signed certificate: %v, %v", parsed, err)
		}
	})
}

// A control plane gets the kubelet-serving CA with the cluster's other
// keys; a cluster made before that CA has none to give, and a pair half
// there is an error, not a control plane whose controller manager cannot
// start.
func TestControlPlaneFilesOfTheKubeletServingCA(t *testing.T) {
	names := func(files []*joinpb.ControlPlaneFile) []string {
		var out []string
		for _, f := range files {
			out = append(out, f.GetName())
		}
		return out
	}
	pki := newPKIDir(t)
	s := &Server{cfg: Config{PKIDir: pki}}
	files, err := s.controlPlaneFiles()
	if err != nil || !slices.Equal(names(files), controlplanes.PKIFiles) {
		t.Fatalf("files %v, %v; want %v", names(files), err, controlplanes.PKIFiles)
	}
	os.Remove(filepath.Join(pki, controlplanes.KubeletServingCAFiles[1]))
	if _, err := s.controlPlaneFiles(); err == nil || !strings.Contains(err.Error(), "half") {
		t.Fatalf("with half the kubelet-serving CA: %v, want an error", err)
	}
	os.Remove(filepath.Join(pki, controlplanes.KubeletServingCAFiles[0]))
	files, err = s.controlPlaneFiles()
	if err != nil || len(files) != len(controlplanes.PKIFiles)-2 || slices.ContainsFunc(names(files), func(n string) bool { return strings.HasPrefix(n, "kubelet-serving") }) {
		t.Fatalf("a cluster made before the kubelet-serving CA: %v, %v", names(files), err)
	}
	os.Remove(filepath.Join(pki, "ca.key"))
	if _, err := s.controlPlaneFiles(); err == nil {
		t.Fatal("without the cluster CA's key: no error")
	}
}
