package cmd

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/owner/ownertest"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
	"github.com/orrery-dev/orrery/internal/versions"
)

// startInitNode serves node over attested TLS from a provisioned swtpm
// and returns its address, the platform CA file and a measurements file
// that matches it.
func startInitNode(t *testing.T, node *ownertest.Node) (addr, caPath, measPath string) {
	t.Helper()
	return startInitNodeAt(t, node, 0)
}

// startInitNodeAt starts the node after delay (a node still booting),
// returning before it is up.
func startInitNodeAt(t *testing.T, node *ownertest.Node, delay time.Duration) (string, string, string) {
	t.Helper()
	n := qemutest.NewNode(t)
	addr := ownertest.Serve(t, n, node, delay)
	return addr, n.CAFile(t), writeMeasurements(t, make([]byte, 32))
}

func TestInitWaitsForBootingNode(t *testing.T) {
	node := &ownertest.Node{}
	addr, caPath, measPath := startInitNodeAt(t, node, 3*time.Second)
	dir := t.TempDir()
	secretPath := filepath.Join(dir, "init-secret")
	os.WriteFile(secretPath, []byte("s3cret"), 0o600)
	var stdout, stderr bytes.Buffer
	code := Execute(context.Background(), []string{"init", "--mini-dir", filepath.Join(dir, "none"), "--node", addr,
		"--measurements", measPath, "--platform-ca", caPath, "--init-secret-file", secretPath,
		"--workspace", filepath.Join(dir, "out"), "--timeout", "30s", "--skip-services"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("init: exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "waiting for "+addr) {
		t.Errorf("init did not say it waits for the node:\n%s", stdout.String())
	}
}

func TestInit(t *testing.T) {
	node := &ownertest.Node{}
	addr, caPath, measPath := startInitNode(t, node)
	dir := t.TempDir()
	secretPath := filepath.Join(dir, "init-secret")
	os.WriteFile(secretPath, []byte("s3cret\n"), 0o600)
	out := filepath.Join(dir, "out")
	args := []string{"init", "--mini-dir", filepath.Join(dir, "no-mini"), "--node", addr, "--measurements", measPath,
		"--platform-ca", caPath, "--init-secret-file", secretPath, "--workspace", out, "--timeout", "30s",
		"--cluster-name", "demo", "--api-server-san", "api.example.org", "--endpoint", "api.example.org", "--skip-services"}

	var stdout, stderr bytes.Buffer
	if code := Execute(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("init: exit %d: %s%s", code, stdout.String(), stderr.String())
	}
	for _, want := range []string{"Generated the master secret", "running kubeadm init", "The cluster is initialised"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	ms, err := keys.ReadMasterSecretFile(filepath.Join(out, workspace.MasterSecretFile))
	if err != nil {
		t.Fatal(err)
	}
	req := node.Requests()[0]
	if !bytes.Equal(req.GetMasterSecret(), ms.Key) || req.GetClusterName() != "demo" || req.GetApiServerCertSans()[0] != "api.example.org" || req.GetServiceCidr() != "10.96.0.0/12" ||
		req.GetControlPlaneEndpoint() != "api.example.org:6443" {
		t.Fatalf("request does not carry the owner's settings: %v", req)
	}
	if bytes.Equal(req.GetMeasurementSalt(), ms.Salt) {
		t.Fatal("measurement salt equals the master salt")
	}
	for _, f := range []string{workspace.MasterSecretFile, workspace.KubeconfigFile, workspace.StateFile} {
		st, err := os.Stat(filepath.Join(out, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v; want mode 0600", f, st, err)
		}
	}
	var state workspace.State
	raw, _ := os.ReadFile(filepath.Join(out, workspace.StateFile))
	json.Unmarshal(raw, &state)
	msec, _ := ms.MeasurementSecret()
	wantID, _ := keys.ClusterID(msec, state.MeasurementSalt)
	if !bytes.Equal(state.ClusterID, wantID) {
		t.Fatalf("state cluster ID %x, want %x", state.ClusterID, wantID)
	}

	// A run interrupted before the node answered (no cluster ID yet) is
	// resumed with the same master secret and salt.
	state.ClusterID = nil
	raw, _ = json.Marshal(state)
	if err := os.WriteFile(filepath.Join(out, workspace.StateFile), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := Execute(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("second init: exit %d: %s", code, stderr.String())
	}
	if !bytes.Equal(node.Requests()[1].GetMeasurementSalt(), req.GetMeasurementSalt()) || !bytes.Equal(node.Requests()[1].GetMasterSecret(), req.GetMasterSecret()) {
		t.Fatal("a retry sent different secrets: the node would derive another cluster ID")
	}
}

func TestInitErrors(t *testing.T) {
	node := &ownertest.Node{}
	addr, caPath, measPath := startInitNode(t, node)
	dir := t.TempDir()
	secret := func(s string) string {
		p := filepath.Join(t.TempDir(), "init-secret")
		os.WriteFile(p, []byte(s), 0o600)
		return p
	}
	tests := map[string]struct {
		args    []string
		fail    bool
		wantErr string
		wantLog bool
	}{
		"wrong init secret": {args: []string{"--init-secret-file", secret("guess")}, wantErr: "wrong init secret"},
		"wrong measurements": {args: []string{"--init-secret-file", secret("s3cret"), "--measurements", writeMeasurements(t, bytes.Repeat([]byte{1}, 32))},
			wantErr: "PCR 11 mismatch"},
		"kubeadm fails": {args: []string{"--init-secret-file", secret("s3cret")}, fail: true, wantErr: "run kubeadm init: exit status 1", wantLog: true},
		"no node":       {args: []string{"--node", "", "--init-secret-file", secret("s3cret")}, wantErr: "pass --node"},
		"bad endpoint":  {args: []string{"--init-secret-file", secret("s3cret"), "--endpoint", "10.42.0.2:http"}, wantErr: "control-plane endpoint"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			node.Fail = tc.fail
			out := filepath.Join(t.TempDir(), "out")
			args := append([]string{"init", "--mini-dir", filepath.Join(dir, "none"), "--node", addr, "--measurements", measPath,
				"--platform-ca", caPath, "--workspace", out, "--timeout", "20s", "--skip-services"}, tc.args...)
			var stdout, stderr bytes.Buffer
			if code := Execute(context.Background(), args, &stdout, &stderr); code == 0 {
				t.Fatalf("init succeeded: %s", stdout.String())
			}
			if !strings.Contains(stderr.String(), tc.wantErr) {
				t.Fatalf("stderr %q lacks %q", stderr.String(), tc.wantErr)
			}
			if _, err := os.Stat(filepath.Join(out, workspace.JournalFile)); (err == nil) != tc.wantLog {
				t.Errorf("journal file present = %v, want %v", err == nil, tc.wantLog)
			}
			if _, err := os.Stat(filepath.Join(out, workspace.KubeconfigFile)); err == nil {
				t.Error("a failed init wrote a kubeconfig")
			}
		})
	}
}

// lockingNode takes the real node lock on its swtpm, as bootstrapperd's
// init server does, and its kubeadm runs until the owner gives up; a
// retry by the owner of the lock gets the result.
type lockingNode struct {
	initpb.UnimplementedInitServiceServer
	lock   *nodelock.Lock
	locked chan struct{} // closed once the first init took the lock
	once   sync.Once
	mu     sync.Mutex
	inits  int
}

func (n *lockingNode) Init(req *initpb.InitRequest, stream initpb.InitService_InitServer) error {
	n.mu.Lock()
	n.inits++
	n.mu.Unlock()
	id, err := ownertest.ClusterID(req)
	if err != nil {
		return err
	}
	took, err := n.lock.TryLock(id)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if !took {
		if mine, err := n.lock.LockedTo(id); err != nil || !mine {
			return status.Error(codes.FailedPrecondition, "this node already belongs to a cluster")
		}
		return stream.Send(&initpb.InitResponse{Kind: &initpb.InitResponse_Done{Done: &initpb.InitSuccess{Kubeconfig: []byte("kubeconfig"), ClusterId: id}}})
	}
	stream.Send(&initpb.InitResponse{Kind: &initpb.InitResponse_Progress{Progress: &initpb.Progress{Phase: "kubeadm-init", Message: "running kubeadm init"}}})
	n.once.Do(func() { close(n.locked) })
	<-stream.Context().Done()
	return stream.Context().Err()
}

func (n *lockingNode) initCount() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.inits
}

// An init cancelled after the node lock leaves PCR 15 non-zero; the same
// owner's retry must still accept the node, and nobody else's may.
func TestInitRetryAfterNodeLock(t *testing.T) {
	n := qemutest.NewNode(t)
	node := &lockingNode{lock: nodelock.New(n.TPM.Open, n.Log), locked: make(chan struct{})}
	addr := ownertest.Serve(t, n, node, 0)
	dir := t.TempDir()
	secretPath := filepath.Join(dir, "init-secret")
	os.WriteFile(secretPath, []byte("s3cret"), 0o600)
	caPath, measPath := n.CAFile(t), writeMeasurements(t, make([]byte, 32))
	initArgs := func(out string) []string {
		return []string{"init", "--mini-dir", filepath.Join(dir, "none"), "--node", addr, "--measurements", measPath,
			"--platform-ca", caPath, "--init-secret-file", secretPath, "--workspace", out, "--timeout", "30s", "--skip-services"}
	}
	out := filepath.Join(dir, "owner")

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-node.locked
		cancel()
	}()
	var stdout, stderr bytes.Buffer
	if code := Execute(ctx, initArgs(out), &stdout, &stderr); code == 0 {
		t.Fatalf("the cancelled init succeeded: %s", stdout.String())
	}

	// Other owners, each with both files so that they count as retries.
	otherSecret := filepath.Join(dir, "other-secret")
	other, _ := keys.GenerateMasterSecret(rand.Reader)
	copyFile(t, filepath.Join(out, workspace.StateFile), filepath.Join(otherSecret, workspace.StateFile))
	if err := keys.WriteMasterSecretFile(filepath.Join(otherSecret, workspace.MasterSecretFile), other); err != nil {
		t.Fatal(err)
	}
	otherSalt := filepath.Join(dir, "other-salt")
	copyFile(t, filepath.Join(out, workspace.MasterSecretFile), filepath.Join(otherSalt, workspace.MasterSecretFile))
	salt, _ := keys.GenerateSalt(rand.Reader)
	os.MkdirAll(otherSalt, 0o700)
	first, err := workspace.Dir(out).ReadState()
	if err != nil {
		t.Fatal(err)
	}
	first.MeasurementSalt = salt
	if err := workspace.Dir(otherSalt).WriteState(first); err != nil {
		t.Fatal(err)
	}
	before := node.initCount()
	for name, out := range map[string]string{"new owner": filepath.Join(dir, "new"), "other master secret": otherSecret, "other salt": otherSalt} {
		stdout.Reset()
		stderr.Reset()
		if code := Execute(context.Background(), initArgs(out), &stdout, &stderr); code == 0 {
			t.Fatalf("%s: init on a node locked to another cluster succeeded", name)
		}
		if !strings.Contains(stderr.String(), "PCR 15 mismatch") {
			t.Fatalf("%s: stderr %q; want a PCR 15 mismatch", name, stderr.String())
		}
	}
	if node.initCount() != before {
		t.Fatal("the CLI sent its secrets to a node locked to another cluster")
	}

	stdout.Reset()
	stderr.Reset()
	if code := Execute(context.Background(), initArgs(out), &stdout, &stderr); code != 0 {
		t.Fatalf("the owner's retry: exit %d: %s", code, stderr.String())
	}
	if _, err := os.Stat(filepath.Join(out, workspace.KubeconfigFile)); err != nil {
		t.Fatalf("the retry wrote no kubeconfig: %v", err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	raw, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// --kubernetes-version takes a release the image carries or its minor
// alone (its newest patch); the node is sent the full release. Anything
// else is refused before the node is asked anything, naming what the
// image carries.
func TestInitKubernetesVersion(t *testing.T) {
	node := &ownertest.Node{}
	addr, caPath, measPath := startInitNode(t, node)
	secretPath := filepath.Join(t.TempDir(), "init-secret")
	os.WriteFile(secretPath, []byte("s3cret"), 0o600)
	init := func(version string) (int, string) {
		var stdout, stderr bytes.Buffer
		code := Execute(context.Background(), []string{"init", "--mini-dir", filepath.Join(t.TempDir(), "none"), "--node", addr,
			"--measurements", measPath, "--platform-ca", caPath, "--init-secret-file", secretPath,
			"--workspace", filepath.Join(t.TempDir(), "out"), "--timeout", "30s", "--skip-services", "--kubernetes-version", version}, &stdout, &stderr)
		return code, stderr.String()
	}
	newest := map[string]string{}
	for _, v := range versions.List() {
		newest[versions.Minor(v)] = v
	}
	for _, v := range versions.List() {
		for _, asked := range []string{v, versions.Minor(v)} {
			if code, stderr := init(asked); code != 0 {
				t.Fatalf("init --kubernetes-version %s: exit %d: %s", asked, code, stderr)
			}
			reqs := node.Requests()
			if got, want := reqs[len(reqs)-1].GetKubernetesVersion(), map[bool]string{true: v, false: newest[versions.Minor(v)]}[asked == v]; got != want {
				t.Errorf("init --kubernetes-version %s sent %q, want %s", asked, got, want)
			}
		}
	}
	asked := len(node.Requests())
	for _, bad := range []string{"v1.20", "v1.20.0", "latest", "v1.37.99", ""} {
		code, stderr := init(bad)
		if code == 0 || !strings.Contains(stderr, "is not supported by this image; supported: "+strings.Join(versions.List(), ", ")) {
			t.Errorf("init --kubernetes-version %q: exit %d, %q; want it refused naming what the image carries", bad, code, stderr)
		}
	}
	if n := len(node.Requests()); n != asked {
		t.Errorf("refused versions still asked the node %d times", n-asked)
	}
}
