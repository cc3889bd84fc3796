package owner

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/owner/dialer"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
)

// fakeNode answers Init as bootstrapperd does, but runs no kubeadm: it
// derives the cluster ID from what it receives, so the tests check what
// the library sends.
type fakeNode struct {
	initpb.UnimplementedInitServiceServer
	mu       sync.Mutex
	requests []*initpb.InitRequest
	fail     bool
}

func (f *fakeNode) Init(req *initpb.InitRequest, stream initpb.InitService_InitServer) error {
	f.mu.Lock()
	f.requests = append(f.requests, req)
	f.mu.Unlock()
	if string(req.GetInitSecret()) != "s3cret" {
		return status.Error(codes.PermissionDenied, "wrong init secret")
	}
	stream.Send(&initpb.InitResponse{Kind: &initpb.InitResponse_Progress{Progress: &initpb.Progress{Phase: "kubeadm-init", Message: "running kubeadm init"}}})
	stream.Send(&initpb.InitResponse{Kind: &initpb.InitResponse_Log{Log: &initpb.LogChunk{Data: []byte("[certs] Generating \"ca\"\n[kubeconfig] Writing\n")}}})
	if f.fail {
		return stream.Send(&initpb.InitResponse{Kind: &initpb.InitResponse_Failed{Failed: &initpb.InitFailure{ErrorMessage: "run kubeadm init: exit status 1", Journal: []byte("the journal")}}})
	}
	ms := keys.MasterSecret{Key: req.GetMasterSecret(), Salt: req.GetMasterSecretSalt()}
	msec, err := ms.MeasurementSecret()
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	id, err := keys.ClusterID(msec, req.GetMeasurementSalt())
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return stream.Send(&initpb.InitResponse{Kind: &initpb.InitResponse_Done{Done: &initpb.InitSuccess{Kubeconfig: []byte("kubeconfig"), ClusterId: id}}})
}

func (f *fakeNode) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests)
}

// serve runs node over attested TLS from a provisioned swtpm whose PCRs
// are all zero, as a node's that belongs to no cluster would be in the
// PCRs these tests enforce.
func serve(t *testing.T, node initpb.InitServiceServer) (addr string, n *qemutest.Node) {
	t.Helper()
	n = qemutest.NewNode(t)
	creds, err := atls.NewCredentials(atls.Config{Issuer: n.Issuer})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(creds))
	initpb.RegisterInitServiceServer(srv, node)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), n
}

func zeroMeasurements() measurements.M {
	zero := make([]byte, 32)
	return measurements.M{4: {Expected: zero}, 11: {Expected: zero}, 15: {Expected: zero}}
}

type events struct {
	mu  sync.Mutex
	all []Event
}

func (e *events) add(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
}

func (e *events) texts(kind EventKind) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.all {
		if ev.Kind == kind {
			out = append(out, ev.Text)
		}
	}
	return out
}

func initConfig(t *testing.T, addr string, n *qemutest.Node, ws workspace.Dir, ev *events) InitConfig {
	return InitConfig{
		Node: addr, Measurements: zeroMeasurements(), PlatformCA: n.CA.Cert, InitSecret: []byte("s3cret"),
		Workspace: ws, KubernetesVersion: "v1.36.3", ClusterName: "demo", ServiceCIDR: "10.96.0.0/12",
		SkipServices: true, Progress: ev.add,
	}
}

func TestInitReportsStepsAndKeepsTheOwnersFiles(t *testing.T) {
	node := &fakeNode{}
	addr, n := serve(t, node)
	ws := workspace.Dir(t.TempDir())
	var ev events
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := Init(ctx, initConfig(t, addr, n, ws, &ev))
	if err != nil {
		t.Fatal(err)
	}
	ms, err := keys.ReadMasterSecretFile(ws.Path(workspace.MasterSecretFile))
	if err != nil {
		t.Fatal(err)
	}
	st, err := ws.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	msec, _ := ms.MeasurementSecret()
	wantID, _ := keys.ClusterID(msec, st.MeasurementSalt)
	if !bytes.Equal(res.ClusterID, wantID) || !bytes.Equal(st.ClusterID, wantID) {
		t.Fatalf("cluster ID %x (state %x), want %x", res.ClusterID, st.ClusterID, wantID)
	}
	if kc, err := os.ReadFile(res.Kubeconfig); err != nil || string(kc) != "kubeconfig" {
		t.Fatalf("kubeconfig %q, %v", kc, err)
	}
	// The node's own step and kubeadm's phases, as steps, in order.
	steps := strings.Join(ev.texts(Step), "|")
	if steps != "running kubeadm init|kubeadm certs|kubeadm kubeconfig" {
		t.Errorf("steps %q", steps)
	}
	notices := strings.Join(ev.texts(Notice), "\n")
	for _, want := range []string{"Generated the master secret", `Initialising the cluster "demo"`, "The cluster is initialised"} {
		if !strings.Contains(notices, want) {
			t.Errorf("notices lack %q:\n%s", want, notices)
		}
	}
	if strings.Contains(notices, string(ms.Key)) {
		t.Fatal("a notice holds the master secret")
	}

	// A retry sends the same secrets and says nothing about a new one.
	var again events
	if _, err := Init(ctx, initConfig(t, addr, n, ws, &again)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(node.requests[1].GetMeasurementSalt(), node.requests[0].GetMeasurementSalt()) ||
		!bytes.Equal(node.requests[1].GetMasterSecret(), node.requests[0].GetMasterSecret()) {
		t.Fatal("a retry sent different secrets: the node would derive another cluster ID")
	}
	if strings.Contains(strings.Join(again.texts(Notice), "\n"), "Generated") {
		t.Error("a retry generated another master secret")
	}
}

// A node whose attestation does not match is refused before it sees a
// single request: waiting cannot change what it runs.
func TestInitRefusesANodeThatRunsAnotherImage(t *testing.T) {
	node := &fakeNode{}
	addr, n := serve(t, node)
	cfg := initConfig(t, addr, n, workspace.Dir(t.TempDir()), &events{})
	cfg.Measurements[11] = measurements.Measurement{Expected: bytes.Repeat([]byte{1}, 32)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := Init(ctx, cfg)
	var refused *dialer.NotAttestedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "PCR 11 mismatch") {
		t.Fatalf("err %v; want a NotAttestedError naming PCR 11", err)
	}
	if node.count() != 0 {
		t.Fatal("the library sent the master secret to a node it refused")
	}
}

// A failed kubeadm leaves its output and the node's journal in the
// workspace, and no kubeconfig.
func TestInitFailureKeepsWhatTheNodeSent(t *testing.T) {
	node := &fakeNode{fail: true}
	addr, n := serve(t, node)
	ws := workspace.Dir(t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := Init(ctx, initConfig(t, addr, n, ws, &events{}))
	if err == nil || !strings.Contains(err.Error(), "run kubeadm init: exit status 1") || !strings.Contains(err.Error(), "[kubeconfig] Writing") {
		t.Fatalf("err %v; want kubeadm's failure and the end of its output", err)
	}
	if j, _ := os.ReadFile(ws.Path(workspace.JournalFile)); string(j) != "the journal" {
		t.Errorf("journal file holds %q", j)
	}
	if _, err := os.Stat(ws.Path(workspace.KubeconfigFile)); err == nil {
		t.Error("a failed init wrote a kubeconfig")
	}
}

// A node that belongs to a cluster has stopped its bootstrapper: init
// says so instead of waiting for a node that seems to boot.
func TestInitOnInitialisedNode(t *testing.T) {
	api := httptest.NewTLSServer(http.NotFoundHandler())
	defer api.Close()
	_, apiPort, _ := net.SplitHostPort(api.Listener.Addr().String())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	lis.Close()
	_, n := serve(t, &fakeNode{})
	cfg := initConfig(t, closed, n, workspace.Dir(t.TempDir()), &events{})
	cfg.APIServerPort, _ = strconv.Atoi(apiPort)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err = Init(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "already belongs to a cluster") {
		t.Fatalf("err %v; want 'already belongs to a cluster'", err)
	}
	if time.Since(start) > 20*time.Second {
		t.Fatalf("init took %s to notice; it should not wait for its timeout", time.Since(start))
	}
}

func TestVerify(t *testing.T) {
	addr, n := serve(t, &fakeNode{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := Verify(ctx, VerifyConfig{Node: addr, Measurements: zeroMeasurements(), PlatformCAs: []*x509.Certificate{n.CA.Cert}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Instance != n.Instance {
		t.Errorf("instance %v, want the certified %v", res.Instance, n.Instance)
	}
	other := qemutest.NewNode(t)
	if _, err := Verify(ctx, VerifyConfig{Node: addr, Measurements: zeroMeasurements(), PlatformCAs: []*x509.Certificate{other.CA.Cert}}); err == nil {
		t.Fatal("a node certified by another platform CA passed")
	}
}
