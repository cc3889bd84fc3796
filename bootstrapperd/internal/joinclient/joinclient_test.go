package joinclient

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm"
	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/atls/atlstest"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/owneraccess"
	"github.com/orrery-dev/orrery/internal/pendingjoin"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/role"
	"github.com/orrery-dev/orrery/internal/testkit/syncbuffer"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm/swtpmtest"
	"github.com/orrery-dev/orrery/internal/versions"
)

type meta struct {
	self  metadata.Instance
	peers []metadata.Instance
}

func (m meta) Self(context.Context) (metadata.Instance, error) { return m.self, nil }

// Endpoint: the tests' cloud has no load balancer.
func (m meta) Endpoint(context.Context) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.New("no control-plane endpoint")
}
func (m meta) Peers(context.Context) ([]metadata.Instance, error) {
	return append(slices.Clone(m.peers), m.self), nil
}

var cp0 = metadata.Instance{Name: "cp-0", Role: role.ControlPlane, IP: netip.MustParseAddr("10.42.1.100")}

// joinService answers every request with resp and records what it got.
type joinService struct {
	joinpb.UnimplementedJoinServiceServer
	resp  *joinpb.IssueJoinTicketResponse
	mu    sync.Mutex
	got   *joinpb.IssueJoinTicketRequest
	calls int
}

func (s *joinService) IssueJoinTicket(_ context.Context, req *joinpb.IssueJoinTicketRequest) (*joinpb.IssueJoinTicketResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got, s.calls = req, s.calls+1
	// A copy: gRPC may still be marshalling it after the client gave up,
	// while the test sets the next answer.
	return proto.Clone(s.resp).(*joinpb.IssueJoinTicketResponse), nil
}

// respond makes the service hand out resp from now on.
func (s *joinService) respond(resp *joinpb.IssueJoinTicketResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resp = resp
}

func (s *joinService) requests() (*joinpb.IssueJoinTicketRequest, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got, s.calls
}

type lock struct {
	free bool
	id   []byte
	// measure, when set, extends the node's PCR 15 as the real lock does:
	// from then on the node no longer attests as an unlocked node.
	measure func(id []byte)
}

func (l *lock) TryLock(id []byte) (bool, error) {
	if !l.free {
		return false, nil
	}
	l.free, l.id = false, id
	if l.measure != nil {
		l.measure(id)
	}
	return true, nil
}

func (l *lock) LockedTo(id []byte) (bool, error) { return !l.free && bytes.Equal(l.id, id), nil }

type disk struct{ key []byte }

func (d *disk) UUID(context.Context) (string, error) {
	return "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f", nil
}
func (d *disk) Rekey(_ context.Context, k []byte) error { d.key = k; return nil }

type joiner struct {
	p        *kubeadm.JoinParams
	attempts []kubeadm.JoinParams
	fail     int // fail this many joins first
	resets   int
	mu       sync.Mutex
}

func (j *joiner) Join(_ context.Context, p kubeadm.JoinParams, _ io.Writer) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.attempts = append(j.attempts, p)
	if j.fail > 0 {
		j.fail--
		return errors.New("kubeadm join: exit status 1")
	}
	j.p = &p
	return nil
}

func (j *joiner) Reset(context.Context, io.Writer) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.resets++
	return nil
}

func (j *joiner) attemptsSoFar() []kubeadm.JoinParams {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.attempts)
}

func ticket() *joinpb.IssueJoinTicketResponse {
	return &joinpb.IssueJoinTicketResponse{
		StateDiskKey: bytes.Repeat([]byte{5}, 32), MeasurementSalt: bytes.Repeat([]byte{6}, 32),
		MeasurementSecret: bytes.Repeat([]byte{7}, 32), KubeletCert: []byte("der"),
		ApiServerEndpoint: "10.42.1.100:6443", ClusterCaCert: []byte("ca der"),
		OwnerAccessKey: bytes.Repeat([]byte{8}, 32), KubernetesVersion: versions.Default,
	}
}

// platform is a local cloud in miniature: one platform CA, and the nodes
// it provisioned.
type platform struct{ ca *platformca.CA }

func newPlatform(t *testing.T) *platform {
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	return &platform{ca: ca}
}

// bootedNode is a node of p that booted the image identified by image:
// the firmware measured its kernel and initrd into PCRs 4 and 9, the UKI
// its sections into PCR 11 and the initrd its phase markers after them.
func (p *platform) bootedNode(t *testing.T, image string) *qemutest.Node {
	return p.node(t, image, image)
}

// node is bootedNode with a kernel and initrd of one image and a UKI of
// another (only PCR 11 differs from a node of kernelImage).
func (p *platform) node(t *testing.T, kernelImage, ukiImage string) *qemutest.Node {
	return qemutest.NewNodeOf(t, p.ca).Boot(t, kernelImage, ukiImage)
}

// controlPlane is a node of image locked to a cluster, as every control
// plane is.
func (p *platform) controlPlane(t *testing.T, image string) *qemutest.Node {
	return lockNode(t, p.bootedNode(t, image))
}

func lockNode(t *testing.T, n *qemutest.Node) *qemutest.Node { return n.Lock(t, "cluster ID") }

// serveJoin runs svc over attested TLS with creds, and returns its address.
func serveJoin(t *testing.T, cfg atls.Config, svc *joinService) string {
	return atlstest.Serve(t, cfg, func(srv *grpc.Server) { joinpb.RegisterJoinServiceServer(srv, svc) })
}

// genuineService is the join service of a control plane cp: it attests
// with cp's vTPM and requires the joining node to attest as self does.
func genuineService(t *testing.T, cp, self *qemutest.Node, svc *joinService) string {
	rw := swtpmtest.Open(t, self.TPM)
	pcrs, err := client.ReadPCRs(rw, tpm2.PCRSelection{Hash: tpm2.AlgSHA256, PCRs: []int{4, 9, 11, 15}})
	rw.Close()
	if err != nil {
		t.Fatal(err)
	}
	m := measurements.M{}
	for pcr, v := range pcrs.GetPcrs() {
		m[pcr] = measurements.Measurement{Expected: v}
	}
	v, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: m, PlatformCAs: []*x509.Certificate{self.CA.Cert}})
	if err != nil {
		t.Fatal(err)
	}
	return serveJoin(t, atls.Config{Issuer: cp.Issuer, Validators: []attestation.Validator{v}}, svc)
}

// route sends connections for each control plane's join service port to
// a test server, as the network would (or an attacker on it).
func route(routes map[netip.Addr]string) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil || ap.Port() != joinpb.Port || routes[ap.Addr()] == "" {
			return nil, fmt.Errorf("dial %s: connection refused", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", routes[ap.Addr()])
	}
}

// setup wires a worker or control-plane node (self) to one genuine
// control plane, cp-0, of the same platform and image.
func setup(t *testing.T, r role.Role, resp *joinpb.IssueJoinTicketResponse, failFirst bool) (Config, *joinService, *lock, *disk, *joiner) {
	p := newPlatform(t)
	self := p.bootedNode(t, "image-1")
	svc := &joinService{resp: resp}
	addr := genuineService(t, p.controlPlane(t, "image-1"), self, svc)
	cfg := nodeConfig(t, self, r, []metadata.Instance{cp0})
	cfg.Lock.(*lock).measure = func(id []byte) { self.Lock(t, string(id)) }
	dial := route(map[netip.Addr]string{cp0.IP: addr})
	var calls atomic.Int32
	cfg.dialNet = func(ctx context.Context, addr string) (net.Conn, error) {
		if calls.Add(1) == 1 && failFirst {
			return nil, errors.New("connection refused")
		}
		return dial(ctx, addr)
	}
	return cfg, svc, cfg.Lock.(*lock), cfg.Disk.(*disk), cfg.Joiner.(*joiner)
}

// nodeConfig is the join client of node self, which trusts its own
// platform CA, with the given control planes in the metadata service.
func nodeConfig(t *testing.T, self *qemutest.Node, r role.Role, peers []metadata.Instance) Config {
	dir := t.TempDir()
	return Config{
		Metadata: meta{self: metadata.Instance{Name: "worker-0", Role: r, IP: netip.MustParseAddr("10.42.2.100")}, peers: peers},
		Issuer:   self.Issuer, OpenTPM: self.TPM.Open, PlatformCAs: []*x509.Certificate{self.CA.Cert},
		Lock: &lock{free: true}, Disk: &disk{}, Joiner: &joiner{},
		StateDir: filepath.Join(dir, "state"), KubeletPKIDir: filepath.Join(dir, "kubelet"), PKIDir: filepath.Join(dir, "pki"),
		RecordOwner: func(_ context.Context, k ed25519.PublicKey) error {
			return owneraccess.Write(filepath.Join(dir, "orrery-owner", "access-key.pem"), k)
		},
		Retry: 10 * time.Millisecond,
	}
}

func TestJoinWorker(t *testing.T) {
	cfg, svc, l, d, j := setup(t, role.Worker, ticket(), true)
	if err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	got, _ := svc.requests()
	wantID, _ := keys.ClusterID(bytes.Repeat([]byte{7}, 32), bytes.Repeat([]byte{6}, 32))
	if !bytes.Equal(l.id, wantID) {
		t.Fatalf("locked to %x, want %x", l.id, wantID)
	}
	if !bytes.Equal(d.key, bytes.Repeat([]byte{5}, 32)) {
		t.Fatal("disk not re-keyed with the ticket's key")
	}
	if got.GetIsControlPlane() || got.GetDiskUuid() == "" || len(got.GetCertificateRequest()) == 0 {
		t.Fatalf("request %v", got)
	}
	if j.p == nil || j.p.Endpoint != "10.42.1.100:6443" || j.p.ControlPlane || j.p.NodeName != "worker-0" || j.p.KubernetesVersion != versions.Default {
		t.Fatalf("kubeadm join params: %v", j.p != nil)
	}
	// kubeadm gets the ticket's CA and certificate, and the key the node
	// made for the certificate request it sent.
	if !bytes.Equal(j.p.CACert, []byte("ca der")) || !bytes.Equal(j.p.ClientCert, []byte("der")) {
		t.Fatal("kubeadm join did not get the ticket's cluster CA and client certificate")
	}
	csr, err := x509.ParseCertificateRequest(got.GetCertificateRequest())
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(j.p.ClientKey)
	if block == nil {
		t.Fatal("kubeadm join got no PEM client key")
	}
	key, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil || !key.PublicKey.Equal(csr.PublicKey) {
		t.Fatalf("kubeadm join got a client key that is not the CSR's (%v)", err)
	}
	if salt, _ := os.ReadFile(filepath.Join(cfg.StateDir, "measurement-salt")); !bytes.Equal(salt, bytes.Repeat([]byte{6}, 32)) {
		t.Fatal("measurement salt not kept for rejoin")
	}
	if owner, err := owneraccess.Read(filepath.Join(filepath.Dir(cfg.StateDir), "orrery-owner", "access-key.pem")); err != nil || !bytes.Equal(owner, bytes.Repeat([]byte{8}, 32)) {
		t.Fatalf("the ticket's owner access key was not kept for the inspect service: %x, %v", owner, err)
	}
	if _, err := os.Stat(filepath.Join(cfg.KubeletPKIDir, NodeClientCertFile)); err != nil {
		t.Fatalf("the issued client certificate is not kept: %v", err)
	}
	if pendingjoin.Exists(cfg.StateDir) {
		t.Error("the ticket is still kept after the join finished")
	}
	// The key reaches kubeadm in memory only: a copy on the state disk
	// would be a second, long-lived credential for the node.
	entries, err := os.ReadDir(cfg.KubeletPKIDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(cfg.KubeletPKIDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("PRIVATE KEY")) {
			t.Errorf("%s holds a private key; the node's client key must not be written to disk", e.Name())
		}
	}
	// The ticket's certificate is a client certificate: it must not
	// become the kubelet's serving certificate, which kubelet makes
	// itself when kubelet.crt and kubelet.key are missing.
	for _, f := range []string{"kubelet.crt", "kubelet.key"} {
		if _, err := os.Stat(filepath.Join(cfg.KubeletPKIDir, f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s written (%v): the join ticket's certificate is no serving certificate", f, err)
		}
	}
	csr, err = x509.ParseCertificateRequest(got.GetCertificateRequest())
	if err != nil {
		t.Fatal(err)
	}
	if csr.Subject.CommonName != "system:node:worker-0" || len(csr.DNSNames)+len(csr.IPAddresses) > 0 {
		t.Fatalf("CSR asks for %v, DNS names %v, addresses %v; want the node's identity only", csr.Subject, csr.DNSNames, csr.IPAddresses)
	}
}

func TestJoinLosesToInit(t *testing.T) {
	cfg, _, l, d, j := setup(t, role.Worker, ticket(), false)
	l.free = false
	if err := Run(context.Background(), cfg); !errors.Is(err, ErrLockLost) {
		t.Fatalf("err = %v, want ErrLockLost", err)
	}
	if d.key != nil || j.p != nil {
		t.Fatal("a node locked by init was re-keyed or joined")
	}
}

// A ticket may carry kubeadm's shared control-plane files only: not a
// path out of the PKI directory, not a certificate of the node's own that
// kubeadm would then use instead of making it.
func TestControlPlaneFilesOnlyKubeadmsSharedSet(t *testing.T) {
	for name, bad := range map[string]string{
		"outside the PKI directory": "../../etc/shadow",
		"absolute":                  "/etc/kubernetes/admin.conf",
		"the API server's key":      "apiserver.key",
		"an etcd server key":        "etcd/server.key",
	} {
		t.Run(name, func(t *testing.T) {
			tk := ticket()
			tk.ControlPlaneFiles = []*joinpb.ControlPlaneFile{{Name: "etcd/ca.crt", Data: []byte("ok")}, {Name: bad, Data: []byte("x")}}
			cfg, svc, l, _, j := setup(t, role.ControlPlane, tk, false)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			err := Run(ctx, cfg)
			if err == nil || j.p != nil {
				t.Fatalf("err = %v, joined = %v; want a refusal", err, j.p != nil)
			}
			if !l.free {
				t.Fatal("a bad ticket took the node lock")
			}
			root := filepath.Dir(cfg.PKIDir)
			filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() && !strings.HasPrefix(path, cfg.StateDir) {
					t.Errorf("a bad ticket wrote %s", path)
				}
				return nil
			})
			good := ticket()
			good.ControlPlaneFiles = tk.ControlPlaneFiles[:1]
			svc.respond(good)
			if err := Run(context.Background(), cfg); err != nil || j.p == nil || !j.p.ControlPlane {
				t.Fatalf("good control-plane ticket: %v", err)
			}
			if got, _ := os.ReadFile(filepath.Join(cfg.PKIDir, "etcd", "ca.crt")); !strings.HasPrefix(string(got), "ok") {
				t.Fatal("the control-plane file was not written")
			}
		})
	}
}

func TestBadOwnerKeyRefusedBeforeTheLock(t *testing.T) {
	tk := ticket()
	tk.OwnerAccessKey = []byte("short")
	cfg, _, l, _, j := setup(t, role.Worker, tk, false)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := Run(ctx, cfg); err == nil || j.p != nil || !l.free {
		t.Fatalf("a ticket with a 5-byte owner key: err %v, joined %v, lock free %v; want a refusal before the lock", err, j.p != nil, l.free)
	}
}

// A node whose image lacks the cluster's version takes no ticket: it is
// refused before the lock, says why, and keeps asking (the cluster may be
// upgraded to a version its image carries).
func TestVersionTheImageLacksRefusedBeforeTheLock(t *testing.T) {
	for _, v := range []string{"v1.99.0", "", versions.Minor(versions.Default)} {
		tk := ticket()
		tk.KubernetesVersion = v
		cfg, svc, l, _, j := setup(t, role.Worker, tk, false)
		var logs syncbuffer.Buffer
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Run(ctx, cfg) }()
		// Until it asked again, or a minute (each attempt attests on
		// swtpm).
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if _, n := svc.requests(); n >= 2 {
				break
			}
		}
		cancel()
		err := <-done
		if err == nil || j.p != nil || !l.free || pendingjoin.Exists(cfg.StateDir) {
			t.Fatalf("a ticket for Kubernetes %q: err %v, joined %v, lock free %v; want a refusal before the lock", v, err, j.p != nil, l.free)
		}
		if !strings.Contains(logs.String(), "which this node's image does not carry (it carries "+strings.Join(versions.List(), ", ")+")") {
			t.Errorf("a ticket for Kubernetes %q: the log does not say the image lacks it:\n%s", v, logs.String())
		}
		if _, n := svc.requests(); n < 2 {
			t.Errorf("a ticket for Kubernetes %q: asked %d times, want the node to keep asking", v, n)
		}
	}
}

func TestJoinRetriedAfterLockTakenFinishes(t *testing.T) {
	cfg, svc, l, d, j := setup(t, role.Worker, ticket(), false)
	j.fail = 1
	// A failed kubeadm join is retried with the ticket the node kept: the
	// genuine join service, which expects PCR 15 zero, refuses the node
	// once the lock has extended it (a starved worker whose kubeadm join
	// failed after the lock asked for a new ticket and was refused for
	// good).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := Run(ctx, cfg); err != nil {
		t.Fatalf("a join that failed after taking the lock did not finish on retry: %v", err)
	}
	if _, calls := svc.requests(); calls != 1 {
		t.Fatalf("the join service was asked %d times, want once: a locked node gets no other ticket", calls)
	}
	if pendingjoin.Exists(cfg.StateDir) {
		t.Fatal("the kept ticket is still on the state disk after the join finished")
	}
	wantID, _ := keys.ClusterID(bytes.Repeat([]byte{7}, 32), bytes.Repeat([]byte{6}, 32))
	if !bytes.Equal(l.id, wantID) || j.p == nil || !bytes.Equal(d.key, bytes.Repeat([]byte{5}, 32)) {
		t.Fatalf("lock %x (want %x), joined %v", l.id, wantID, j.p != nil)
	}
	if j.resets != 1 {
		t.Fatalf("kubeadm reset ran %d times before the retry, want 1", j.resets)
	}
}

func TestJoinLockedToAnotherClusterStops(t *testing.T) {
	cfg, _, l, _, j := setup(t, role.Worker, ticket(), false)
	l.free, l.id = false, []byte("another cluster")
	if err := Run(context.Background(), cfg); !errors.Is(err, ErrLockLost) {
		t.Fatalf("err = %v, want ErrLockLost", err)
	}
	if j.resets != 0 || j.p != nil {
		t.Fatal("a node locked to another cluster was reset or joined")
	}
}

func TestRetriesBackOff(t *testing.T) {
	cfg, _, _, _, _ := setup(t, role.Worker, ticket(), false)
	failures := 6
	dial := cfg.dialNet
	cfg.dialNet = func(ctx context.Context, addr string) (net.Conn, error) {
		if failures > 0 {
			failures--
			return nil, errors.New("connection refused")
		}
		return dial(ctx, addr)
	}
	var pauses []time.Duration
	cfg.after = func(d time.Duration) <-chan time.Time {
		pauses = append(pauses, d)
		c := make(chan time.Time, 1)
		c <- time.Now()
		return c
	}
	cfg.Retry, cfg.MaxRetry = 2*time.Second, 15*time.Second
	if err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 15 * time.Second, 15 * time.Second, 15 * time.Second}
	if fmt.Sprint(pauses) != fmt.Sprint(want) {
		t.Fatalf("pauses %v, want %v", pauses, want)
	}
}
