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

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/owner/dialer"
	"github.com/orrery-dev/orrery/internal/owner/ownertest"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
)

// serve runs node over attested TLS from a provisioned swtpm whose PCRs
// are all zero, as a node's that belongs to no cluster would be in the
// PCRs these tests enforce.
func serve(t *testing.T, node initpb.InitServiceServer) (addr string, n *qemutest.Node) {
	t.Helper()
	n = qemutest.NewNode(t)
	return ownertest.Serve(t, n, node, 0), n
}

func zeroMeasurements() policy.Policy {
	zero := make([]byte, 32)
	return policy.Policy{PCRs: measurements.M{4: {Expected: zero}, 11: {Expected: zero}, 15: {Expected: zero}}}
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
		Node: addr, Measurements: zeroMeasurements(), PlatformCA: n.CA.Cert, InitSecret: []byte(ownertest.InitSecret),
		Workspace: ws, KubernetesVersion: "v1.36.3", ClusterName: "demo", ServiceCIDR: "10.96.0.0/12",
		SkipServices: true, Progress: ev.add,
	}
}

func TestInitReportsStepsAndKeepsTheOwnersFiles(t *testing.T) {
	node := &ownertest.Node{}
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

	// Run again after kubeadm finished, init has nothing to send: the
	// node's bootstrapper has stopped; only the services are left.
	// (The test's node still listens, so an API server answers beside it,
	// as on a node whose bootstrapper would have stopped.)
	var done events
	rerun := initConfig(t, addr, n, ws, &done)
	rerun.APIServerPort = apiServerStandIn(t)
	if _, err := Init(ctx, rerun); err != nil {
		t.Fatal(err)
	}
	if len(node.Requests()) != 1 || !strings.Contains(strings.Join(done.texts(Notice), "\n"), "initialised on "+addr+" by an earlier run") {
		t.Fatalf("init run again after it finished sent %d requests and said %q; want no request and that it finishes the services", len(node.Requests())-1, done.texts(Notice))
	}

	// Interrupted before the node answered (no cluster ID yet), a retry
	// sends the same secrets and says nothing about a new one.
	st.ClusterID = nil
	if err := ws.WriteState(st); err != nil {
		t.Fatal(err)
	}
	var again events
	if _, err := Init(ctx, initConfig(t, addr, n, ws, &again)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(node.Requests()[1].GetMeasurementSalt(), node.Requests()[0].GetMeasurementSalt()) ||
		!bytes.Equal(node.Requests()[1].GetMasterSecret(), node.Requests()[0].GetMasterSecret()) {
		t.Fatal("a retry sent different secrets: the node would derive another cluster ID")
	}
	if strings.Contains(strings.Join(again.texts(Notice), "\n"), "Generated") {
		t.Error("a retry generated another master secret")
	}

	checkRefusesAnotherClusterInTheWorkspace(t, ctx, node, addr, n, ws)
}

// checkRefusesAnotherClusterInTheWorkspace runs init of another cluster
// in ws, where node's cluster was initialised with two requests.
func checkRefusesAnotherClusterInTheWorkspace(t *testing.T, ctx context.Context, node *ownertest.Node, addr string, n *qemutest.Node, ws workspace.Dir) {
	t.Helper()
	// Another node, from the same workspace, is refused before anything
	// is sent: two clusters must not share a master secret.
	other := initConfig(t, addr, n, ws, &events{})
	other.ClusterName = "second"
	if _, err := Init(ctx, other); err == nil || !strings.Contains(err.Error(), "--workspace") {
		t.Fatalf("init of another cluster in the same workspace: %v; want a refusal", err)
	}
	if len(node.Requests()) != 2 {
		t.Fatal("a refused workspace still sent a request")
	}
}

// A node whose attestation does not match is refused before it sees a
// single request: waiting cannot change what it runs.
func TestInitRefusesANodeThatRunsAnotherImage(t *testing.T) {
	node := &ownertest.Node{}
	addr, n := serve(t, node)
	cfg := initConfig(t, addr, n, workspace.Dir(t.TempDir()), &events{})
	cfg.Measurements.PCRs[11] = measurements.Measurement{Expected: bytes.Repeat([]byte{1}, 32)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := Init(ctx, cfg)
	var refused *dialer.NotAttestedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "PCR 11 mismatch") {
		t.Fatalf("err %v; want a NotAttestedError naming PCR 11", err)
	}
	if len(node.Requests()) != 0 {
		t.Fatal("the library sent the master secret to a node it refused")
	}
	if entries, _ := os.ReadDir(string(cfg.Workspace)); len(entries) != 0 {
		t.Fatalf("init wrote %v for a node it refused; want nothing before a node attested", entries)
	}
}

// A node locked to someone else's cluster (its daemon still in the
// hand-over after that init) attests as the right image but for PCR 15:
// the owner is told it belongs to a cluster, and nothing is sent to it.
// A node that differs in another PCR as well is refused for its image.
func TestInitOnANodeLockedToAnotherCluster(t *testing.T) {
	for name, tc := range map[string]struct {
		otherImage bool
		want       string
	}{
		"locked only":           {want: "already belongs to a cluster: it runs the expected image, but its node lock (PCR 15)"},
		"locked and another OS": {otherImage: true, want: "is not running the expected image"},
	} {
		t.Run(name, func(t *testing.T) {
			node := &ownertest.Node{}
			addr, n := serve(t, node)
			n.Lock(t, "someone else's cluster")
			cfg := initConfig(t, addr, n, workspace.Dir(t.TempDir()), &events{})
			if tc.otherImage {
				cfg.Measurements.PCRs[11] = measurements.Measurement{Expected: bytes.Repeat([]byte{1}, 32)}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := Init(ctx, cfg)
			var refused *dialer.NotAttestedError
			if !errors.As(err, &refused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v; want a NotAttestedError saying %q", err, tc.want)
			}
			if tc.otherImage == strings.Contains(err.Error(), "already belongs") {
				t.Errorf("err %v", err)
			}
			if len(node.Requests()) != 0 {
				t.Fatal("the library sent the master secret to a node it refused")
			}
		})
	}
}

// A failed kubeadm leaves its output and the node's journal in the
// workspace, and no kubeconfig.
func TestInitFailureKeepsWhatTheNodeSent(t *testing.T) {
	node := &ownertest.Node{Fail: true}
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
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	lis.Close()
	_, n := serve(t, &ownertest.Node{})
	cfg := initConfig(t, closed, n, workspace.Dir(t.TempDir()), &events{})
	cfg.APIServerPort = apiServerStandIn(t)
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

// apiServerStandIn is a TLS server on the loopback, where init looks
// for a node's API server; it returns its port.
func apiServerStandIn(t *testing.T) int {
	api := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(api.Close)
	_, port, _ := net.SplitHostPort(api.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	return p
}

// A workspace whose cluster is gone, run against new VMs: the node's
// bootstrapper answers and no API server does, so init says to replace
// the workspace instead of waiting for an API server that never comes.
func TestInitWithAWorkspaceOfAnotherCluster(t *testing.T) {
	node := &ownertest.Node{}
	addr, n := serve(t, node)
	ws := workspace.Dir(t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := Init(ctx, initConfig(t, addr, n, ws, &events{})); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, closedPort, _ := net.SplitHostPort(lis.Addr().String())
	lis.Close()
	cfg := initConfig(t, addr, n, ws, &events{})
	cfg.APIServerPort, _ = strconv.Atoi(closedPort)
	_, err = Init(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "it is a new VM") || !strings.Contains(err.Error(), "--replace-workspace") {
		t.Fatalf("err %v; want one that says the node is new and to replace the workspace", err)
	}
	if len(node.Requests()) != 1 {
		t.Errorf("the node got %d init requests, want only the first run's", len(node.Requests()))
	}

	// With --replace-workspace, the old files are set aside and the new
	// VM is initialised.
	var replaced events
	cfg = initConfig(t, addr, n, ws, &replaced)
	cfg.APIServerPort, _ = strconv.Atoi(closedPort)
	cfg.ReplaceWorkspace = true
	if _, err := Init(ctx, cfg); err != nil {
		t.Fatalf("init --replace-workspace of a new VM: %v", err)
	}
	notices := strings.Join(replaced.texts(Notice), "\n")
	if len(node.Requests()) != 2 || !strings.Contains(notices, "no longer runs") || !strings.Contains(notices, "Moved the earlier init's files") {
		t.Errorf("init --replace-workspace sent %d requests and said:\n%s\nwant a new init, the old files set aside", len(node.Requests()), notices)
	}
	if bytes.Equal(node.Requests()[1].GetMeasurementSalt(), node.Requests()[0].GetMeasurementSalt()) {
		t.Error("the new cluster was sent the old one's measurement salt")
	}
}

func TestVerify(t *testing.T) {
	addr, n := serve(t, &ownertest.Node{})
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

// The owner sees where init's time goes: the phase in which kubeadm
// waits for the API server says so, and the node's own steps keep
// their names.
func TestKubeadmStepSaysWhatItWaitsFor(t *testing.T) {
	for phase, want := range map[string]string{
		"certs":         "kubeadm certs",
		"kubelet-start": "kubeadm kubelet-start (until the API server answers)",
		"orrery-images": "orrery-images",
	} {
		if got := kubeadmStep(phase); got != want {
			t.Errorf("kubeadmStep(%q) = %q, want %q", phase, got, want)
		}
	}
}
