package upgradeserver

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm/kubeadmtest"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/kuberelease"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/kuberelease/kubereleasetest"
	"github.com/orrery-dev/orrery/internal/proto/kubeupgradepb"
	"github.com/orrery-dev/orrery/internal/versions"
)

// runner stands for kubeadm: it records what ran, prints a line with a
// secret in it, and does what hook says.
type runner struct {
	mu    sync.Mutex
	calls []string
	hook  func(ctx context.Context, name string, args []string) error
}

func (r *runner) Run(ctx context.Context, name string, args []string, _ io.Reader, out io.Writer) error {
	r.mu.Lock()
	r.calls = append(r.calls, name+" "+strings.Join(args, " "))
	r.mu.Unlock()
	io.WriteString(out, "[upgrade] kubeadm says hello\n[upgrade] token abcdef.0123456789abcdef\n")
	if r.hook != nil {
		return r.hook(ctx, name, args)
	}
	return nil
}

func (r *runner) ran() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

// kubelet stands for the kubelet service: it records which release each
// restart started, and is healthy unless the release is in sick.
type kubelet struct {
	node     kuberelease.Node
	mu       sync.Mutex
	restarts []string
	sick     map[string]bool
}

func (k *kubelet) Restart(context.Context, io.Writer) error {
	v, err := k.node.Active()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.restarts = append(k.restarts, v)
	return err
}

func (k *kubelet) Healthy(context.Context) error {
	v, _ := k.node.Active()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.sick[v] {
		return errors.New("connection refused")
	}
	return nil
}

// fakeEtcd is a member whose snapshot is data; its membership tests are
// in etcdmembers_test.go.
type fakeEtcd struct {
	data []byte
	membership
}

func (e fakeEtcd) Stream(_ context.Context, send func([]byte, uint64) error) error {
	for i := 0; i < len(e.data); i += 4 {
		if err := send(e.data[i:min(i+4, len(e.data))], uint64(len(e.data)-min(i+4, len(e.data)))); err != nil {
			return err
		}
	}
	return nil
}

type fixture struct {
	node    kuberelease.Node
	runner  *runner
	kubelet *kubelet
	client  kubeupgradepb.KubernetesUpgradeServiceClient
	cfg     Config
}

// newFixture serves a node that has joined a cluster and runs release
// running; manifests, if not empty, makes it a control plane.
func newFixture(t *testing.T, running, manifests string) *fixture {
	t.Helper()
	f := &fixture{node: kubereleasetest.Root(t), runner: &runner{}}
	if running != "" {
		if err := f.node.Activate(running); err != nil {
			t.Fatal(err)
		}
	}
	f.kubelet = &kubelet{node: f.node, sick: map[string]bool{}}
	dir := t.TempDir()
	if manifests == "" {
		manifests = filepath.Join(dir, "no-manifests")
	}
	f.cfg = Config{
		Release: f.node, Kubeadm: &kubeadm.Tool{Runner: f.runner, ConfigDir: filepath.Join(dir, "run"), AdminKubeconfig: filepath.Join(dir, "admin.conf")},
		Manifests: manifests, KubeletConfig: filepath.Join(dir, "kubelet.conf"), KubeadmBackups: filepath.Join(dir, "kubeadm-tmp"),
		Kubelet: f.kubelet, Etcd: fakeEtcd{data: []byte("etcd database, then its hash"), membership: &fakeMembers{}},
		KubeletWait: 2 * time.Second, Log: slog.New(slog.DiscardHandler),
	}
	if err := os.WriteFile(f.cfg.KubeletConfig, []byte("kubeconfig"), 0o600); err != nil {
		t.Fatal(err)
	}
	admin := "clusters:\n- cluster:\n    server: https://10.42.0.2:6443\n"
	if err := os.WriteFile(f.cfg.Kubeadm.AdminKubeconfig, []byte(admin), 0o600); err != nil {
		t.Fatal(err)
	}
	f.client = serve(t, New(f.cfg))
	return f
}

func serve(t *testing.T, s *Server) kubeupgradepb.KubernetesUpgradeServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	kubeupgradepb.RegisterKubernetesUpgradeServiceServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
	})
	return kubeupgradepb.NewKubernetesUpgradeServiceClient(conn)
}

// upgrade runs one Upgrade call to its end: its output and error.
func (f *fixture) upgrade(ctx context.Context, version string, step kubeupgradepb.Step) (string, error) {
	stream, err := f.client.Upgrade(ctx, &kubeupgradepb.UpgradeRequest{KubernetesVersion: version, Step: step})
	if err != nil {
		return "", err
	}
	var out strings.Builder
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out.String(), nil
		}
		if err != nil {
			return out.String(), err
		}
		for _, l := range m.GetLines() {
			out.WriteString(l + "\n")
		}
	}
}

func releases(t *testing.T) (oldest, newest string) {
	t.Helper()
	vs := versions.List()
	if len(vs) < 2 {
		t.Skip("the image carries one release")
	}
	return vs[len(vs)-2], vs[len(vs)-1]
}

func TestAWorkerUpgradesWithTheTargetsKubeadmThenSwitchesKubelet(t *testing.T) {
	oldest, newest := releases(t)
	f := newFixture(t, oldest, "")
	if err := os.MkdirAll(filepath.Join(f.cfg.KubeadmBackups, "kubeadm-backup-etcd-x"), 0o700); err != nil {
		t.Fatal(err)
	}
	out, err := f.upgrade(t.Context(), newest, kubeupgradepb.Step_STEP_NODE)
	if err != nil {
		t.Fatalf("upgrade: %v\n%s", err, out)
	}
	if _, err := os.Stat(f.cfg.KubeadmBackups); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("kubeadm's backups are still there after the upgrade: %v", err)
	}
	dir, _ := kuberelease.Folder(newest)
	if got := f.runner.ran(); len(got) != 1 || !strings.HasPrefix(got[0], filepath.Join(f.node.Root, dir, "kubeadm")+" upgrade node --config ") {
		t.Errorf("ran %q, want %s's kubeadm upgrade node", got, newest)
	}
	if got, _ := f.node.Active(); got != newest || strings.Join(f.kubelet.restarts, " ") != newest {
		t.Errorf("runs %s, kubelet restarted on %v; want %s once", got, f.kubelet.restarts, newest)
	}
	if !strings.Contains(out, "kubeadm says hello") || strings.Contains(out, "0123456789abcdef") || !strings.Contains(out, "is healthy after") {
		t.Errorf("output, want kubeadm's lines, redacted, and the kubelet's switch:\n%s", out)
	}
	r, err := f.client.Releases(t.Context(), &kubeupgradepb.ReleasesRequest{})
	if err != nil || r.GetRunning() != newest || r.GetControlPlane() || len(r.GetCarried()) != len(versions.List()) {
		t.Errorf("Releases = %v, %v; want %s running on a worker", r, err, newest)
	}
}

func TestTheFirstControlPlaneAppliesWithItsPatchesAndTheEndpoint(t *testing.T) {
	oldest, newest := releases(t)
	pods := kubeadmtest.KeptPods(t, oldest)
	f := newFixture(t, oldest, pods)
	var patches []string
	f.runner.hook = func(_ context.Context, _ string, args []string) error {
		entries, _ := os.ReadDir(filepath.Join(f.cfg.Kubeadm.ConfigDir, "kubeadm-upgrade-patches"))
		for _, e := range entries {
			b, _ := os.ReadFile(filepath.Join(f.cfg.Kubeadm.ConfigDir, "kubeadm-upgrade-patches", e.Name()))
			patches = append(patches, e.Name()+": "+string(b))
		}
		return nil
	}
	out, err := f.upgrade(t.Context(), newest, kubeupgradepb.Step_STEP_APPLY)
	if err != nil {
		t.Fatalf("upgrade: %v\n%s", err, out)
	}
	if got := f.runner.ran(); len(got) != 1 || !strings.Contains(got[0], " upgrade apply --config ") || !strings.HasSuffix(got[0], " --yes") {
		t.Errorf("ran %q, want kubeadm upgrade apply", got)
	}
	all := strings.Join(patches, "\n")
	// CoreDNS goes to the endpoint of admin.conf, the load balancer, not
	// to this control plane, which may leave the cluster.
	if !strings.Contains(all, "corednsdeployment") || !strings.Contains(all, `"10.42.0.2"`) || strings.Contains(all, kubeadmtest.NodeIP.String()) || !strings.Contains(all, "kube-apiserver+strategic.yaml") {
		t.Errorf("kubeadm got patches\n%s\nwant the control plane's and CoreDNS's pointing at the endpoint 10.42.0.2", all)
	}
}

func TestRefusals(t *testing.T) {
	oldest, newest := releases(t)
	for _, c := range []struct {
		name       string
		running    string
		joined     bool
		version    string
		step       kubeupgradepb.Step
		want       codes.Code
		wantInText string
	}{
		{"a release the image lacks", oldest, true, "v1.99.0", kubeupgradepb.Step_STEP_NODE, codes.InvalidArgument, "does not carry"},
		{"a minor alone", oldest, true, versions.Minor(newest), kubeupgradepb.Step_STEP_NODE, codes.InvalidArgument, "does not carry"},
		{"no step", oldest, true, newest, kubeupgradepb.Step_STEP_UNSPECIFIED, codes.InvalidArgument, "step"},
		{"a downgrade", newest, true, oldest, kubeupgradepb.Step_STEP_NODE, codes.FailedPrecondition, "downgraded"},
		{"apply on a worker", oldest, true, newest, kubeupgradepb.Step_STEP_APPLY, codes.FailedPrecondition, "no control plane"},
		{"a node of no cluster", oldest, false, newest, kubeupgradepb.Step_STEP_NODE, codes.FailedPrecondition, "part of no cluster"},
		{"a node running no release", "", true, newest, kubeupgradepb.Step_STEP_NODE, codes.FailedPrecondition, "runs no Kubernetes release"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, c.running, "")
			if !c.joined {
				os.Remove(f.cfg.KubeletConfig)
			}
			_, err := f.upgrade(t.Context(), c.version, c.step)
			if status.Code(err) != c.want || !strings.Contains(err.Error(), c.wantInText) {
				t.Errorf("err = %v, want %v saying %q", err, c.want, c.wantInText)
			}
			if ran := f.runner.ran(); len(ran) != 0 || len(f.kubelet.restarts) != 0 {
				t.Errorf("a refused upgrade ran %q and restarted kubelet %d times", ran, len(f.kubelet.restarts))
			}
			if got, _ := f.node.Active(); got != c.running {
				t.Errorf("runs %q after a refusal, want %q", got, c.running)
			}
		})
	}
}

func TestAFailedKubeadmLeavesTheNodeOnItsRelease(t *testing.T) {
	oldest, newest := releases(t)
	f := newFixture(t, oldest, "")
	f.runner.hook = func(context.Context, string, []string) error {
		// kubeadm's backups, which it restored from.
		return errors.Join(os.MkdirAll(filepath.Join(f.cfg.KubeadmBackups, "kubeadm-backup-etcd-x"), 0o700), errors.New("exit status 1"))
	}
	_, err := f.upgrade(t.Context(), newest, kubeupgradepb.Step_STEP_NODE)
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "still runs "+oldest) {
		t.Errorf("err = %v, want Aborted saying the node still runs %s", err, oldest)
	}
	if _, err := os.Stat(f.cfg.KubeadmBackups); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("kubeadm's backups after a failed upgrade: %v, want them gone", err)
	}
	if got, _ := f.node.Active(); got != oldest || len(f.kubelet.restarts) != 0 {
		t.Errorf("runs %s, kubelet restarted %v; want %s untouched", got, f.kubelet.restarts, oldest)
	}
}

func TestAKubeletThatDoesNotComeUpIsSwitchedBack(t *testing.T) {
	oldest, newest := releases(t)
	f := newFixture(t, oldest, "")
	f.kubelet.sick[newest] = true
	out, err := f.upgrade(t.Context(), newest, kubeupgradepb.Step_STEP_NODE)
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "runs "+oldest+" again") {
		t.Errorf("err = %v, want Aborted saying kubelet runs %s again\n%s", err, oldest, out)
	}
	if got, _ := f.node.Active(); got != oldest || strings.Join(f.kubelet.restarts, " ") != newest+" "+oldest {
		t.Errorf("runs %s, kubelet restarted on %v; want %s then back on %s", got, f.kubelet.restarts, newest, oldest)
	}
}

// An upgrade goes on when its caller goes away, and a caller that asks
// again follows it from its first line to its end; another upgrade waits.
func TestAnUpgradeOutlivesItsCaller(t *testing.T) {
	oldest, newest := releases(t)
	f := newFixture(t, oldest, "")
	started, release := make(chan struct{}), make(chan struct{})
	f.runner.hook = func(ctx context.Context, _ string, _ []string) error {
		close(started)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	first := make(chan error, 1)
	go func() {
		_, err := f.upgrade(ctx, newest, kubeupgradepb.Step_STEP_NODE)
		first <- err
	}()
	<-started
	cancel()
	if err := <-first; status.Code(err) != codes.Canceled {
		t.Fatalf("the first caller's call ended with %v, want Canceled", err)
	}
	if _, err := f.upgrade(t.Context(), oldest, kubeupgradepb.Step_STEP_NODE); status.Code(err) != codes.Unavailable {
		t.Errorf("another upgrade during one: %v, want Unavailable", err)
	}
	// The second caller follows the running upgrade: its first message
	// holds the lines printed before kubeadm blocked.
	stream, err := f.client.Upgrade(t.Context(), &kubeupgradepb.UpgradeRequest{KubernetesVersion: newest, Step: kubeupgradepb.Step_STEP_NODE})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	m, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	close(release)
	for ; err == nil; m, err = stream.Recv() {
		for _, l := range m.GetLines() {
			out.WriteString(l + "\n")
		}
	}
	if !errors.Is(err, io.EOF) {
		out.WriteString("error: " + err.Error())
	}
	if got := out.String(); !strings.HasPrefix(got, "[orrery-upgrade]") || !strings.Contains(got, "is healthy after") || strings.Contains(got, "error:") {
		t.Errorf("the second caller saw\n%s\nwant the whole upgrade from its first line, and its success", got)
	}
	if got := f.runner.ran(); len(got) != 1 {
		t.Errorf("kubeadm ran %d times, want once", len(got))
	}
	if got, _ := f.node.Active(); got != newest {
		t.Errorf("runs %s, want %s", got, newest)
	}
}

// Stopping the service (systemd's SIGTERM, a shutdown the hypervisor
// asks for) cuts the followers' streams, but neither kills kubeadm nor
// ends the service before the upgrade did.
func TestTheServiceWaitsForItsUpgrade(t *testing.T) {
	oldest, newest := releases(t)
	f := newFixture(t, oldest, "")
	srv := New(f.cfg)
	client := serve(t, srv)
	started, release := make(chan struct{}), make(chan struct{})
	killed := make(chan error, 1)
	f.runner.hook = func(ctx context.Context, _ string, _ []string) error {
		close(started)
		<-release
		killed <- ctx.Err()
		return nil
	}
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		stream, err := client.Upgrade(ctx, &kubeupgradepb.UpgradeRequest{KubernetesVersion: newest, Step: kubeupgradepb.Step_STEP_NODE})
		for err == nil {
			_, err = stream.Recv()
		}
	}()
	<-started
	cancel()
	if v, busy := srv.Busy(); !busy || v != newest {
		t.Fatalf("Busy() = %q, %v with kubeadm running, want %s, true", v, busy, newest)
	}
	waited := make(chan struct{})
	go func() { srv.Wait(); close(waited) }()
	select {
	case <-waited:
		t.Fatal("Wait returned while kubeadm ran")
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	select {
	case <-waited:
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not return once the upgrade ended")
	}
	if err := <-killed; err != nil {
		t.Errorf("kubeadm's context ended with its caller: %v", err)
	}
	if got, _ := f.node.Active(); got != newest {
		t.Errorf("runs %s, want %s: the upgrade did not finish", got, newest)
	}
	if _, busy := srv.Busy(); busy {
		t.Error("Busy once the upgrade ended")
	}
}

func TestBackupEtcd(t *testing.T) {
	oldest, _ := releases(t)
	f := newFixture(t, oldest, "")
	if _, err := recvAll(f.client.BackupEtcd(t.Context(), &kubeupgradepb.BackupEtcdRequest{})); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a worker's etcd backup: %v, want FailedPrecondition", err)
	}
	f = newFixture(t, oldest, kubeadmtest.KeptPods(t, oldest))
	got, err := recvAll(f.client.BackupEtcd(t.Context(), &kubeupgradepb.BackupEtcdRequest{}))
	if err != nil || !bytes.Equal(got, []byte("etcd database, then its hash")) {
		t.Errorf("a control plane's etcd backup: %q, %v", got, err)
	}
}

func recvAll(stream kubeupgradepb.KubernetesUpgradeService_BackupEtcdClient, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	var b []byte
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		b = append(b, m.GetData()...)
	}
}
