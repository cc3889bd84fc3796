package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kuberelease"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/nodestate"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/rekey"
	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/disk/cryptsetup"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
	"github.com/orrery-dev/orrery/internal/role"
	"github.com/orrery-dev/orrery/internal/testkit/syncbuffer"
	"github.com/orrery-dev/orrery/internal/versions"
)

const testInitSecret = "the init secret"

// metadataServer answers /self with the names of names in turn (the last
// one from then on) and /initsecrethash with testInitSecret's hash.
func metadataServer(t *testing.T, names ...string) string {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte(testInitSecret), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var answer any
		switch r.URL.Path {
		case metadata.PathSelf:
			name := names[min(int(asked.Add(1))-1, len(names)-1)]
			answer = metadata.Instance{Name: name, Role: role.ControlPlane, IP: netip.MustParseAddr("10.42.1.100")}
		case metadata.PathInitSecretHash:
			answer = metadata.InitSecretHashAnswer{Hash: string(hash)}
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(answer)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// runner stands in for systemctl, kubeadm and kubectl: every call
// succeeds, and it keeps the calls and the configuration kubeadm init got.
type runner struct {
	mu         sync.Mutex
	calls      []string
	initConfig string
}

func (r *runner) Run(_ context.Context, name string, args []string, _ io.Reader, _ io.Writer) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, name+" "+strings.Join(args, " "))
	if i := slices.Index(args, "--config"); name == "kubeadm" && args[0] == "init" && i >= 0 {
		cfg, err := os.ReadFile(args[i+1])
		if err != nil {
			return err
		}
		r.initConfig = string(cfg)
	}
	return nil
}

func (r *runner) called() ([]string, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls), r.initConfig
}

// rekeyedDisk is a state disk that the master secret's key opens already.
type rekeyedDisk struct{}

func (rekeyedDisk) UUID(context.Context, string) (string, error) {
	return "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f", nil
}
func (rekeyedDisk) Inspect(context.Context, string) (cryptsetup.Volume, error) {
	return cryptsetup.Volume{}, errors.New("not in this test")
}
func (rekeyedDisk) AddKey(context.Context, string, string, string) error {
	return errors.New("not in this test")
}
func (rekeyedDisk) RemoveKey(context.Context, string, string) error {
	return errors.New("not in this test")
}
func (rekeyedDisk) TestKey(context.Context, string, string) (bool, error) { return true, nil }
func (rekeyedDisk) SetLabel(context.Context, string, string) error {
	return errors.New("not in this test")
}
func (rekeyedDisk) SetSubsystem(context.Context, string, string) error { return nil }

func initRequest() *initpb.InitRequest {
	return &initpb.InitRequest{
		MasterSecret:      bytes.Repeat([]byte{1}, 32),
		MasterSecretSalt:  bytes.Repeat([]byte{2}, 32),
		MeasurementSalt:   bytes.Repeat([]byte{3}, 32),
		KubernetesVersion: versions.Default,
		InitSecret:        []byte(testInitSecret),
		ClusterName:       "demo",
		ServiceCidr:       "10.96.0.0/12",
	}
}

// The first control plane registers under the name its platform
// certified: a node that the metadata service (the host's) names otherwise
// is refused before the node lock and before kubeadm, and tells the owner
// what to check; one whose names agree is initialised under that name,
// whatever the metadata service says later, and marked bootstrapped.
func TestInitRegistersOnlyUnderTheCertifiedName(t *testing.T) {
	for name, tc := range map[string]struct {
		// certified is the instance the AK certificate names (zero: none).
		certified string
		// metadata are the names /self answers, in turn.
		metadata []string
		wantErr  string
		wantNode string
	}{
		"names agree":                                 {certified: "cp-0", metadata: []string{"cp-0"}, wantNode: "cp-0"},
		"metadata names a worker":                     {certified: "cp-0", metadata: []string{"w-1"}, wantErr: `the metadata service names this node "w-1", but its attestation key certificate names it cp-0 (instance ID`},
		"metadata changes its answer after the check": {certified: "cp-0", metadata: []string{"cp-0", "w-1"}, wantNode: "cp-0"},
		// As before instances were certified: nothing to hold the name to.
		"no certified instance": {metadata: []string{"cp-0"}, wantNode: "cp-0"},
	} {
		t.Run(name, func(t *testing.T) {
			n := newInitNode(t, tc.certified, tc.metadata...)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			bootstrapped := make(chan struct{})
			// As run wires it, but for closing the socket: the test's
			// daemon listens itself.
			n.b.listen = "127.0.0.1:0"
			client := serveInit(t, n.b, n.node, n.b.onBootstrapped(ctx, func() { close(bootstrapped) }))
			done, err := initOnce(ctx, client)
			if tc.wantErr != "" {
				n.checkRefused(t, err, tc.wantErr)
				return
			}
			if err != nil {
				t.Fatalf("init: %v\n%s", err, n.logs.String())
			}
			locked, err := n.b.lock.IsLocked()
			if err != nil || string(done.GetKubeconfig()) != "admin kubeconfig" || !locked {
				t.Fatalf("init returned %q, node locked %v (%v)", done.GetKubeconfig(), locked, err)
			}
			if _, config := n.tools.called(); !strings.Contains(config, "name: "+tc.wantNode+"\n") {
				t.Errorf("kubeadm init did not register the node as %s:\n%s", tc.wantNode, config)
			}
			// kubeadm ran as the owner's release of the image.
			if v, err := (kuberelease.Node{Root: n.b.paths.root}).Active(); err != nil || v != versions.Default {
				t.Errorf("after init the node runs Kubernetes %q (%v), want the owner's %s", v, err, versions.Default)
			}
			select {
			case <-bootstrapped:
			case <-ctx.Done():
				t.Fatal("the init server never reported the node bootstrapped")
			}
			n.checkBootstrapped(t)
		})
	}
}

// initNode is a node for an init: a TPM whose AK certificate names an
// instance, a metadata service, and stand-ins for kubeadm and systemctl.
type initNode struct {
	b     *bootstrapper
	node  *qemutest.Node
	tools *runner
	logs  *syncbuffer.Buffer
	dir   string
}

// newInitNode is a node whose AK certificate names certified ("" for no
// instance) and whose metadata service answers the names of metadata in
// turn.
func newInitNode(t *testing.T, certified string, metadata ...string) *initNode {
	t.Helper()
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	var inst attestation.Instance
	if certified != "" {
		inst = platformca.NewInstance(certified)
	}
	n := &initNode{node: qemutest.NewInstance(t, ca, inst), tools: &runner{}, logs: &syncbuffer.Buffer{}, dir: t.TempDir()}
	n.b = testBootstrapper(t, n.node.TPM.Open, n.dir, n.logs)
	n.b.meta.BaseURL = metadataServer(t, metadata...)
	n.b.tool.Runner = n.tools
	n.b.tool.AdminKubeconfig = filepath.Join(n.dir, "admin.conf")
	if err := os.WriteFile(n.b.tool.AdminKubeconfig, []byte("admin kubeconfig"), 0o600); err != nil {
		t.Fatal(err)
	}
	n.b.disk = &rekey.Disk{LUKS: rekeyedDisk{}, Device: "/dev/vdb", VolumeRecord: filepath.Join(n.dir, "no-record"),
		FirstBootKey: filepath.Join(n.dir, "no-first-boot-key"), TmpDir: n.dir}
	n.b.tool.Instance = selfInstance(n.b.openTPM, n.b.log) // as run does
	return n
}

// checkRefused checks that init was refused with wantErr and what to
// check, and that the node is left as it was.
func (n *initNode) checkRefused(t *testing.T, err error, wantErr string) {
	t.Helper()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), wantErr) ||
		!strings.Contains(err.Error(), "check the name the metadata service gives this VM") {
		t.Fatalf("init = %v, want FailedPrecondition with %q and what to check", err, wantErr)
	}
	if locked, err := n.b.lock.IsLocked(); err != nil || locked {
		t.Errorf("the refused init locked the node (%v)", err)
	}
	if calls, _ := n.tools.called(); len(calls) != 0 {
		t.Errorf("the refused init ran %q", calls)
	}
	if _, err := os.Stat(filepath.Join(n.dir, "init-request.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused init left its record on the state disk (%v)", err)
	}
	if !strings.Contains(n.logs.String(), "init refused") {
		t.Errorf("the node's log does not tell of the refusal:\n%s", n.logs.String())
	}
}

// checkBootstrapped checks that the node's state says it belongs to a
// cluster: a restarted daemon reports it and leaves.
func (n *initNode) checkBootstrapped(t *testing.T) {
	t.Helper()
	state, err := nodestate.Load(n.b.lock, n.b.paths.state())
	if err != nil {
		t.Fatal(err)
	}
	if step, err := state.Next(); err != nil || step != nodestate.Rejoined || !state.Bootstrapped {
		t.Fatalf("after the init the node's state is %+v, step %v (%v); want it marked bootstrapped and %v", state, step, err, nodestate.Rejoined)
	}
}

// serveInit serves b's init service as run does, until the test ends, and
// returns a client that checks node's attestation.
func serveInit(t *testing.T, b *bootstrapper, node *qemutest.Node, bootstrapped func()) initpb.InitServiceClient {
	t.Helper()
	srv, healthSrv, err := b.server()
	if err != nil {
		t.Fatal(err)
	}
	initpb.RegisterInitServiceServer(srv, b.initServer(bootstrapped))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- b.serve(ctx, srv, healthSrv, lis, time.Now()) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})

	zero := make([]byte, 32)
	v, err := qemu.NewValidator(qemu.ValidatorConfig{
		Measurements: measurements.M{11: {Expected: zero}, 15: {Expected: zero}},
		PlatformCAs:  []*x509.Certificate{node.CA.Cert},
	})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{v}})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return initpb.NewInitServiceClient(conn)
}

// initOnce sends the init request and follows the stream to its end.
func initOnce(ctx context.Context, client initpb.InitServiceClient) (*initpb.InitSuccess, error) {
	stream, err := client.Init(ctx, initRequest())
	if err != nil {
		return nil, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		switch k := resp.GetKind().(type) {
		case *initpb.InitResponse_Done:
			return k.Done, nil
		case *initpb.InitResponse_Failed:
			return nil, errors.New(k.Failed.GetErrorMessage())
		}
	}
}

// checkName asks the metadata service and holds its answer to the
// certified name; a node with no certified instance is not checked.
func TestCheckName(t *testing.T) {
	self := func(name string, err error) func(context.Context) (metadata.Instance, error) {
		return func(context.Context) (metadata.Instance, error) { return metadata.Instance{Name: name}, err }
	}
	log := slog.New(slog.DiscardHandler)
	for name, tc := range map[string]struct {
		certified attestation.Instance
		self      func(context.Context) (metadata.Instance, error)
		want      codes.Code
	}{
		"names agree":             {platformca.NewInstance("cp-0"), self("cp-0", nil), codes.OK},
		"metadata names a worker": {platformca.NewInstance("cp-0"), self("worker-1", nil), codes.FailedPrecondition},
		"metadata service down":   {platformca.NewInstance("cp-0"), self("", errors.New("connection refused")), codes.Unavailable},
		"no certified instance":   {attestation.Instance{}, self("worker-1", nil), codes.OK},
	} {
		if err := checkName(context.Background(), tc.certified, tc.self, log); status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
}
