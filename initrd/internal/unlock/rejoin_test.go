package unlock

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/atls/atlstest"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/joinconn"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/role"
	"github.com/orrery-dev/orrery/internal/testkit/syncbuffer"
	"github.com/orrery-dev/orrery/internal/versions"
)

var (
	self = metadata.Instance{Name: "worker-0", Role: role.Worker, IP: netip.MustParseAddr("10.42.2.100")}
	cp0  = metadata.Instance{Name: "cp-0", Role: role.ControlPlane, IP: netip.MustParseAddr("10.42.1.100")}
)

// meta is the metadata service; it refuses the first downFor questions
// (a network that is not up yet).
type meta struct {
	noEndpoint
	downFor atomic.Int32
}

func (m *meta) Self(context.Context) (metadata.Instance, error) {
	if m.downFor.Add(-1) >= 0 {
		return metadata.Instance{}, errors.New("connection refused")
	}
	return self, nil
}

// noEndpoint is the metadata of a cloud without a load balancer.
type noEndpoint struct{}

func (noEndpoint) Endpoint(context.Context) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.New("no control-plane endpoint")
}

func (m *meta) Peers(context.Context) ([]metadata.Instance, error) {
	return []metadata.Instance{cp0, self}, nil
}

// joinService hands out the rejoin tickets its test sets.
type joinService struct {
	joinpb.UnimplementedJoinServiceServer
	mu      sync.Mutex
	tickets []*joinpb.IssueRejoinTicketResponse // one per call; the last repeats
	asked   []string
}

func (s *joinService) IssueRejoinTicket(_ context.Context, req *joinpb.IssueRejoinTicketRequest) (*joinpb.IssueRejoinTicketResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, req.GetDiskUuid())
	t := s.tickets[0]
	if len(s.tickets) > 1 {
		s.tickets = s.tickets[1:]
	}
	return t, nil
}

func (s *joinService) calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.asked)
}

// serveJoin runs svc as the join service of cp, which requires the
// joining node to attest, as the real one does, and routes cp-0's join
// port to it.
func serveJoin(t *testing.T, cp, joiner *qemutest.Node, svc *joinService) func(ctx context.Context, addr string) (net.Conn, error) {
	t.Helper()
	server := atlstest.Serve(t, atls.Config{Issuer: cp.Issuer, Validators: []attestation.Validator{validatorOf(t, joiner)}},
		func(srv *grpc.Server) { joinpb.RegisterJoinServiceServer(srv, svc) })
	want := netip.AddrPortFrom(cp0.IP, joinpb.Port).String()
	return func(ctx context.Context, addr string) (net.Conn, error) {
		if addr != want {
			return nil, fmt.Errorf("dial %s: connection refused", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", server)
	}
}

// ticket is a rejoin ticket of a worker of a cluster with clusterCA.
func ticket(key, secret byte) *joinpb.IssueRejoinTicketResponse {
	return &joinpb.IssueRejoinTicketResponse{
		StateDiskKey: bytes.Repeat([]byte{key}, 32), MeasurementSecret: bytes.Repeat([]byte{secret}, 32),
		ClusterCaCert: clusterCA(), ApiServerEndpoint: "10.42.1.100:6443",
		OwnerAccessKey: bytes.Repeat([]byte{9}, 32), KubernetesVersion: versions.Default,
	}
}

// clusterCA and leafCert are a cluster CA's certificate and one it
// signed, DER.
var clusterCA, leafCert = func() (func() []byte, func() []byte) {
	certs := sync.OnceValues(func() ([]byte, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		now := time.Now()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		}
		ca, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			panic(err)
		}
		leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"}, NotBefore: tmpl.NotBefore, NotAfter: tmpl.NotAfter}
		der, err := x509.CreateCertificate(rand.Reader, leaf, tmpl, &key.PublicKey, key)
		if err != nil {
			panic(err)
		}
		return ca, der
	})
	return func() []byte { ca, _ := certs(); return ca }, func() []byte { _, leaf := certs(); return leaf }
}()

// rejoin runs a Rejoiner of node against cp's join service until the disk
// opens or the timeout passes, and returns its console.
func rejoin(t *testing.T, node, cp *qemutest.Node, svc *joinService, u *Unlocker, m metadata.Source, timeout time.Duration) string {
	t.Helper()
	dialer, err := joinconn.New(joinconn.Config{
		Issuer: node.Issuer, OpenTPM: node.TPM.Open, PlatformCAs: []*x509.Certificate{node.CA.Cert},
		DialNet: serveJoin(t, cp, node, svc),
	})
	if err != nil {
		t.Fatal(err)
	}
	var console syncbuffer.Buffer
	r := &Rejoiner{
		Metadata: m, JoinService: dialer, DiskUUID: diskUUID, Unlocker: u,
		Say:   func(format string, args ...any) { fmt.Fprintf(&console, format+"\n", args...) },
		Retry: 10 * time.Millisecond, MaxRetry: 50 * time.Millisecond,
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r.Run(ctx)
	return console.String()
}

func TestRejoinOpensTheDisk(t *testing.T) {
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	node := qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-1")
	cp := qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-1").Lock(t, "cluster")
	u, _ := newDisk(t, bytes.Repeat([]byte{1}, 32))
	before := header(t, u)
	// First a key of another cluster, then the disk's, of a control
	// plane.
	right := ticket(1, 2)
	right.ControlPlane = true
	svc := &joinService{tickets: []*joinpb.IssueRejoinTicketResponse{ticket(9, 9), right}}
	m := &meta{}
	// Down for the first question, however long the header check before
	// it takes.
	m.downFor.Store(1)
	console := rejoin(t, node, cp, svc, u, m, time.Minute)
	if !isOpen(u) {
		t.Fatalf("the disk did not open; console:\n%s", console)
	}
	// JoinService: the node checks its disk's generation with it next.
	if got := u.Key(); !bytes.Equal(got.MeasurementSecret, bytes.Repeat([]byte{2}, 32)) || !strings.Contains(got.From, "10.42.1.100:30090") ||
		!bytes.Equal(got.OwnerAccessKey, bytes.Repeat([]byte{9}, 32)) || got.JoinService != "10.42.1.100:30090" {
		t.Errorf("opened with %+v", got)
	}
	// What the initrd checks the kept files against comes with the key.
	switch got := u.Key().Cluster; {
	case got == nil:
		t.Error("opened with no cluster")
	case !bytes.Equal(got.CACert, clusterCA()) || got.Endpoint != "10.42.1.100:6443" || !got.ControlPlane:
		t.Errorf("opened with cluster CA %d bytes (equal: %v), endpoint %q, control plane %v; want the ticket's CA, 10.42.1.100:6443, true",
			len(got.CACert), bytes.Equal(got.CACert, clusterCA()), got.Endpoint, got.ControlPlane)
	}
	for _, want := range []string{"metadata service", "does not open this node's state disk"} {
		if !strings.Contains(console, want) {
			t.Errorf("console lacks %q:\n%s", want, console)
		}
	}
	if !bytes.Equal(header(t, u), before) {
		t.Error("a rejoin changed the LUKS header")
	}
	if svc.asked[0] != diskUUID {
		t.Errorf("asked for disk %q", svc.asked[0])
	}
}

// A join service that cannot prove it is a control plane of this node's
// image never sees the request, and its key is never tried, even the
// right one.
func TestRejoinRefusesAnUnprovenJoinService(t *testing.T) {
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	node := qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-1")
	for name, fake := range map[string]*qemutest.Node{
		"another image":           qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-2").Lock(t, "cluster"),
		"a node not locked":       qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-1"),
		"another platform's vTPM": qemutest.NewNode(t).Boot(t, "image-1", "image-1").Lock(t, "cluster"),
	} {
		t.Run(name, func(t *testing.T) {
			u, luks := newDisk(t, bytes.Repeat([]byte{1}, 32))
			svc := &joinService{tickets: []*joinpb.IssueRejoinTicketResponse{ticket(1, 2)}}
			console := rejoin(t, node, fake, svc, u, &meta{}, 3*time.Second)
			if isOpen(u) || luks.keyTests() != 0 || svc.calls() != 0 {
				t.Fatalf("an unproven join service got the request (%d) or its key was tried (%d)", svc.calls(), luks.keyTests())
			}
			if !strings.Contains(console, "refused the join service") {
				t.Errorf("console does not say why:\n%s", console)
			}
		})
	}
}

// A ticket whose cluster CA or API server endpoint is wrong is refused
// whole: its key is never tried, even the right one, and the console says
// what is wrong.
func TestRejoinRefusesABadTicket(t *testing.T) {
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	node := qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-1")
	cp := qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-1").Lock(t, "cluster")
	for name, tc := range map[string]struct {
		spoil   func(*joinpb.IssueRejoinTicketResponse)
		wantMsg string
	}{
		"garbage CA":   {func(t *joinpb.IssueRejoinTicketResponse) { t.ClusterCaCert = []byte("garbage") }, "cluster CA certificate (7 bytes) is not a DER X.509 certificate"},
		"bad endpoint": {func(t *joinpb.IssueRejoinTicketResponse) { t.ApiServerEndpoint = "https://10.42.1.100:6443" }, "API server endpoint: \"https://10.42.1.100:6443\" has a scheme"},
	} {
		t.Run(name, func(t *testing.T) {
			u, luks := newDisk(t, bytes.Repeat([]byte{1}, 32))
			bad := ticket(1, 2)
			tc.spoil(bad)
			svc := &joinService{tickets: []*joinpb.IssueRejoinTicketResponse{bad}}
			console := rejoin(t, node, cp, svc, u, &meta{}, 3*time.Second)
			if svc.calls() == 0 {
				t.Fatalf("the join service was never asked; console:\n%s", console)
			}
			if isOpen(u) || luks.keyTests() != 0 {
				t.Fatalf("the key of a bad ticket was tried (%d times)", luks.keyTests())
			}
			if !strings.Contains(console, "refusing its rejoin ticket") || !strings.Contains(console, tc.wantMsg) {
				t.Errorf("console does not say %q:\n%s", tc.wantMsg, console)
			}
		})
	}
}

func TestClusterOf(t *testing.T) {
	// A 255-byte endpoint, the longest allowed.
	longest := strings.Repeat("a", 250) + ":6443"
	tests := map[string]struct {
		spoil   func(*joinpb.IssueRejoinTicketResponse)
		wantErr string
	}{
		"good":                   {spoil: func(*joinpb.IssueRejoinTicketResponse) {}},
		"IPv6 endpoint":          {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.ApiServerEndpoint = "[fd00::2]:6443" }},
		"DNS endpoint":           {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.ApiServerEndpoint = "api.cluster.example:443" }},
		"255-byte endpoint":      {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.ApiServerEndpoint = longest }},
		"no CA (an old service)": {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.ClusterCaCert = nil }, wantErr: "not a DER X.509 certificate"},
		"garbage CA":             {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.ClusterCaCert = []byte("garbage") }, wantErr: "not a DER X.509 certificate"},
		"PEM CA": {spoil: func(t *joinpb.IssueRejoinTicketResponse) {
			t.ClusterCaCert = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: t.ClusterCaCert})
		}, wantErr: "not a DER X.509 certificate"},
		"not a CA":                      {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.ClusterCaCert = leafCert() }, wantErr: `(subject "CN=kube-apiserver") is not a CA certificate`},
		"no endpoint":                   {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.ApiServerEndpoint = "" }, wantErr: "is not host:port"},
		"no port":                       {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.ApiServerEndpoint = "10.42.1.100" }, wantErr: "is not host:port"},
		"no host":                       {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.ApiServerEndpoint = ":6443" }, wantErr: "names no host"},
		"named port":                    {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.ApiServerEndpoint = "10.42.1.100:https" }, wantErr: `port "https" is not a number`},
		"port out of range":             {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.ApiServerEndpoint = "10.42.1.100:65536" }, wantErr: `port "65536" is not a number`},
		"port zero":                     {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.ApiServerEndpoint = "10.42.1.100:0" }, wantErr: `port "0" is not a number`},
		"scheme":                        {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.ApiServerEndpoint = "https://api.example:6443" }, wantErr: "has a scheme"},
		"too long":                      {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.ApiServerEndpoint = "a" + longest }, wantErr: "256 bytes, more than 255"},
		"short owner key":               {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.OwnerAccessKey = []byte("short") }, wantErr: "owner access key has 5 bytes, want 32"},
		"no owner key (an old service)": {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.OwnerAccessKey = nil }},
		"a version the image lacks": {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.KubernetesVersion = "v1.99.0" },
			wantErr: `the cluster runs Kubernetes "v1.99.0", which this node's image does not carry (it carries ` + strings.Join(versions.List(), ", ") + "): boot this node from an image that does"},
		"a minor, not a release": {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.KubernetesVersion = versions.Minor(versions.Default) },
			wantErr: "which this node's image does not carry"},
		"no version (an old service)": {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.KubernetesVersion = "" }, wantErr: "names no Kubernetes version"},
		"a path for a version":        {spoil: func(t *joinpb.IssueRejoinTicketResponse) { t.KubernetesVersion = "../../../tmp" }, wantErr: "does not carry"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tk := ticket(1, 2)
			tk.ControlPlane = true
			tc.spoil(tk)
			c, err := clusterOf(tk)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(c.CACert, tk.ClusterCaCert) || c.Endpoint != tk.ApiServerEndpoint || !c.ControlPlane || c.KubernetesVersion != tk.KubernetesVersion {
				t.Errorf("cluster %+v from ticket %v", c, tk)
			}
		})
	}
}

// With no other control plane the console says what to do.
func TestRejoinAloneSaysRecover(t *testing.T) {
	node := qemutest.NewNode(t).Boot(t, "image-1", "image-1")
	u, _ := newDisk(t, bytes.Repeat([]byte{1}, 32))
	alone := metaOnly{self: cp0}
	console := rejoin(t, node, node, &joinService{tickets: []*joinpb.IssueRejoinTicketResponse{ticket(1, 2)}}, u, alone, 200*time.Millisecond)
	if !strings.Contains(console, "orrery recover") {
		t.Errorf("console:\n%s", console)
	}
}

type metaOnly struct {
	noEndpoint
	self metadata.Instance
}

func (m metaOnly) Self(context.Context) (metadata.Instance, error) { return m.self, nil }
func (m metaOnly) Peers(context.Context) ([]metadata.Instance, error) {
	return []metadata.Instance{m.self}, nil
}

type cpMeta struct{ noEndpoint }

var cp1 = metadata.Instance{Name: "cp-1", Role: role.ControlPlane, IP: netip.MustParseAddr("10.42.1.101")}

func (cpMeta) Self(context.Context) (metadata.Instance, error) { return cp1, nil }
func (cpMeta) Peers(context.Context) ([]metadata.Instance, error) {
	return []metadata.Instance{cp0, cp1, self}, nil
}

// A rebooted control plane rejoins through another control plane's join
// service, and never asks its own address.
func TestControlPlaneRejoinsThroughAnother(t *testing.T) {
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	node := qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-1")
	other := qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-1").Lock(t, "cluster")
	u, _ := newDisk(t, bytes.Repeat([]byte{1}, 32))
	svc := &joinService{tickets: []*joinpb.IssueRejoinTicketResponse{ticket(1, 2)}}
	console := rejoin(t, node, other, svc, u, cpMeta{}, time.Minute)
	if !isOpen(u) || !strings.Contains(u.Key().From, cp0.IP.String()) {
		t.Fatalf("cp-1 did not rejoin through cp-0; console:\n%s", console)
	}
}
