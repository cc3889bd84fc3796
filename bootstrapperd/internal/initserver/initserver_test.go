package initserver

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/owneraccess"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm/swtpmtest"
)

const diskUUID = "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f"

type fakeDisk struct {
	mu     sync.Mutex
	rekeys [][]byte
	err    error
}

func (d *fakeDisk) UUID(context.Context) (string, error) { return diskUUID, nil }
func (d *fakeDisk) Rekey(_ context.Context, k []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rekeys = append(d.rekeys, k)
	return d.err
}

type fakeCluster struct {
	release chan struct{} // if set, Init waits for it
	killed  chan struct{} // if set, closing it ends a waiting Init as a dying daemon would
	err     error
	mu      sync.Mutex
	inits   int
	resets  int
	stored  []keys.MasterSecret
}

func (c *fakeCluster) Init(ctx context.Context, p ClusterParams, out io.Writer) ([]byte, error) {
	c.mu.Lock()
	c.inits++
	c.mu.Unlock()
	io.WriteString(out, "[init] Using Kubernetes version: "+p.KubernetesVersion+"\n")
	if c.release != nil {
		select {
		case <-c.release:
		case <-c.killed:
			return nil, errors.New("killed with the daemon")
		}
	}
	if c.err != nil {
		return nil, c.err
	}
	return []byte("apiVersion: v1\nkind: Config\n# " + p.ClusterName + "\n"), nil
}

func (c *fakeCluster) Reset(context.Context, io.Writer) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resets++
	return nil
}

func (c *fakeCluster) StoreMasterSecret(_ context.Context, ms keys.MasterSecret, _ []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stored = append(c.stored, ms)
	return nil
}

type env struct {
	cfg          Config
	tpm          *swtpm.Instance
	disk         *fakeDisk
	cluster      *fakeCluster
	client       initpb.InitServiceClient
	resultPath   string
	ownerKeyPath string
	bootstrapped chan struct{}

	statusMu sync.Mutex
	statuses []string
	// intercept, if set, wraps the server's streams (see serve).
	intercept grpc.StreamServerInterceptor
}

func (e *env) statusLines() []string {
	e.statusMu.Lock()
	defer e.statusMu.Unlock()
	return slices.Clone(e.statuses)
}

const initSecret = "the-init-secret"

func newEnv(t *testing.T, tweaks ...func(*Config)) *env {
	t.Helper()
	e := &env{tpm: swtpmtest.Start(t), disk: &fakeDisk{}, cluster: &fakeCluster{}, bootstrapped: make(chan struct{}, 1)}
	dir := t.TempDir()
	e.resultPath = filepath.Join(dir, "state", "init-result.json")
	e.ownerKeyPath = filepath.Join(dir, "orrery-owner", "access-key.pem")
	hash, err := bcrypt.GenerateFromPassword([]byte(initSecret), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Lock:           nodelock.New(e.tpm.Open, &pcrlog.Log{Path: filepath.Join(dir, "m.log")}),
		Disk:           e.disk,
		Cluster:        e.cluster,
		InitSecretHash: func(context.Context) ([]byte, error) { return hash, nil },
		Supported: func(v string) error {
			if v != "v1.36.3" {
				return errors.New("Kubernetes " + v + " is not supported by this image; supported: v1.36.3")
			}
			return nil
		},
		Journal:    func(context.Context) ([]byte, error) { return []byte("journal lines\n"), nil },
		ResultPath: e.resultPath,
		RecordOwner: func(_ context.Context, k ed25519.PublicKey) error {
			return owneraccess.Write(e.ownerKeyPath, k)
		},
		Bootstrapped: func() { e.bootstrapped <- struct{}{} },
		Status: func(s string) {
			e.statusMu.Lock()
			defer e.statusMu.Unlock()
			e.statuses = append(e.statuses, s)
		},
	}
	for _, tweak := range tweaks {
		tweak(&cfg)
	}
	e.cfg = cfg
	e.serve(t)
	return e
}

// restart replaces the server with a new one over the same TPM and state
// directory, as systemd would restart bootstrapperd; kubeadm's fake
// starts afresh.
func (e *env) restart(t *testing.T) {
	t.Helper()
	e.cluster = &fakeCluster{}
	e.cfg.Cluster = e.cluster
	e.serve(t)
}

func (e *env) serve(t *testing.T) {
	t.Helper()
	srv := New(e.cfg)
	var opts []grpc.ServerOption
	if e.intercept != nil {
		opts = append(opts, grpc.StreamInterceptor(e.intercept))
	}
	g := grpc.NewServer(opts...)
	initpb.RegisterInitServiceServer(g, srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.client = initpb.NewInitServiceClient(conn)
}

func request(seed byte) *initpb.InitRequest {
	return &initpb.InitRequest{
		MasterSecret:      bytes.Repeat([]byte{seed}, 32),
		MasterSecretSalt:  bytes.Repeat([]byte{seed + 1}, 32),
		MeasurementSalt:   bytes.Repeat([]byte{seed + 2}, 32),
		KubernetesVersion: "v1.36.3",
		InitSecret:        []byte(initSecret),
		ClusterName:       "demo",
		ApiServerCertSans: []string{"10.42.1.100", "api.example.org"},
		ServiceCidr:       "10.96.0.0/12",
	}
}

// collect runs Init and returns every message and the final status.
func (e *env) collect(ctx context.Context, req *initpb.InitRequest) ([]*initpb.InitResponse, error) {
	stream, err := e.client.Init(ctx, req)
	if err != nil {
		return nil, err
	}
	var msgs []*initpb.InitResponse
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return msgs, nil
		}
		if err != nil {
			return msgs, err
		}
		msgs = append(msgs, m)
	}
}

func (e *env) pcr15(t *testing.T) []byte {
	t.Helper()
	rw := swtpmtest.Open(t, e.tpm)
	defer rw.Close()
	v, err := tpm2.ReadPCR(rw, 15, tpm2.AlgSHA256)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestBadRequestsChangeNothing(t *testing.T) {
	e := newEnv(t)
	tests := map[string]struct {
		mutate   func(*initpb.InitRequest)
		wantCode codes.Code
		wantMsg  string
	}{
		"short master secret":     {func(r *initpb.InitRequest) { r.MasterSecret = r.MasterSecret[:16] }, codes.InvalidArgument, "master key has 16 bytes"},
		"missing salt":            {func(r *initpb.InitRequest) { r.MasterSecretSalt = nil }, codes.InvalidArgument, "master salt has 0 bytes"},
		"measurement salt reused": {func(r *initpb.InitRequest) { r.MeasurementSalt = r.MasterSecretSalt }, codes.InvalidArgument, "generated separately"},
		"unsupported version":     {func(r *initpb.InitRequest) { r.KubernetesVersion = "v1.35.0" }, codes.InvalidArgument, "not supported by this image"},
		"bad cluster name":        {func(r *initpb.InitRequest) { r.ClusterName = "Demo_1" }, codes.InvalidArgument, "not a DNS label"},
		"bad SAN":                 {func(r *initpb.InitRequest) { r.ApiServerCertSans = []string{"not a name"} }, codes.InvalidArgument, "must each be an IP address or a DNS name"},
		"bad CIDR":                {func(r *initpb.InitRequest) { r.ServiceCidr = "10.96.0.0/33" }, codes.InvalidArgument, "service CIDR"},
		"CIDR with host bits":     {func(r *initpb.InitRequest) { r.ServiceCidr = "10.96.0.1/12" }, codes.InvalidArgument, "did you mean 10.96.0.0/12"},
		"bad endpoint":            {func(r *initpb.InitRequest) { r.ControlPlaneEndpoint = "10.42.0.2" }, codes.InvalidArgument, "control-plane endpoint"},
		"no init secret":          {func(r *initpb.InitRequest) { r.InitSecret = nil }, codes.InvalidArgument, "init secret has 0 bytes"},
		"wrong init secret":       {func(r *initpb.InitRequest) { r.InitSecret = []byte("guess") }, codes.PermissionDenied, "wrong init secret"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			req := request(1)
			tc.mutate(req)
			msgs, err := e.collect(context.Background(), req)
			st := status.Convert(err)
			if st.Code() != tc.wantCode || !strings.Contains(st.Message(), tc.wantMsg) {
				t.Fatalf("status %v %q, want %v containing %q", st.Code(), st.Message(), tc.wantCode, tc.wantMsg)
			}
			if len(msgs) != 0 {
				t.Fatalf("a refused request received %d messages", len(msgs))
			}
		})
	}
	if !bytes.Equal(e.pcr15(t), make([]byte, 32)) || len(e.disk.rekeys) != 0 || e.cluster.inits != 0 {
		t.Fatal("a refused request changed the node")
	}
}

func TestInitSucceedsAndIsIdempotentForItsOwner(t *testing.T) {
	e := newEnv(t)
	req := request(1)
	e.cluster.release = make(chan struct{})

	// The owner's connection drops while kubeadm runs.
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := e.client.Init(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var phases []string
	for len(phases) < 3 {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		if p := m.GetProgress(); p != nil {
			phases = append(phases, p.GetPhase())
		}
	}
	cancel()
	if strings.Join(phases, ",") != "node-lock,rekey-state-disk,kubeadm-init" {
		t.Fatalf("phases %v", phases)
	}

	// Someone else cannot take over the node meanwhile.
	_, err = e.collect(context.Background(), request(7))
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("init for another cluster: %v, want FailedPrecondition", err)
	}

	// The owner retries and gets the result once kubeadm finishes.
	time.AfterFunc(100*time.Millisecond, func() { close(e.cluster.release) })
	msgs, err := e.collect(context.Background(), req)
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	final := msgs[len(msgs)-1].GetDone()
	if final == nil {
		t.Fatalf("retry ended with %v, want success", msgs[len(msgs)-1])
	}
	ms := keys.MasterSecret{Key: req.MasterSecret, Salt: req.MasterSecretSalt}
	msec, _ := ms.MeasurementSecret()
	wantID, _ := keys.ClusterID(msec, req.MeasurementSalt)
	if !bytes.Equal(final.GetClusterId(), wantID) || !strings.Contains(string(final.GetKubeconfig()), "demo") {
		t.Fatalf("result: cluster ID %x (want %x), kubeconfig %q", final.GetClusterId(), wantID, final.GetKubeconfig())
	}
	<-e.bootstrapped
	wantKey, _ := ms.DiskKey(diskUUID)
	if len(e.disk.rekeys) != 1 || !bytes.Equal(e.disk.rekeys[0], wantKey) {
		t.Fatal("state disk was not re-keyed exactly once with the derived disk key")
	}
	if e.cluster.inits != 1 || len(e.cluster.stored) != 1 {
		t.Fatalf("kubeadm ran %d times, secret stored %d times; want 1 and 1", e.cluster.inits, len(e.cluster.stored))
	}
	// systemd hears of every phase, so 'systemctl status' shows it.
	if got := strings.Join(e.statusLines(), "|"); !strings.Contains(got, "init: running kubeadm init") || !strings.Contains(got, "init: storing the master secret") {
		t.Fatalf("statuses told systemd: %q", got)
	}
	if st, err := os.Stat(e.resultPath); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("result file: %v, %v", st, err)
	}
	// The inspect service will answer the holder of this master secret.
	owner, _ := ms.OwnerAccessKey()
	if got, err := owneraccess.Read(e.ownerKeyPath); err != nil || !got.Equal(owner.Public()) {
		t.Fatalf("owner's access key on the node: %x, %v; want the public half of the master secret's", got, err)
	}

	// After a daemon restart, the stored result still answers the owner.
	srv := New(Config{Lock: nil, ResultPath: e.resultPath, Supported: func(string) error { return nil },
		InitSecretHash: func(context.Context) ([]byte, error) {
			return bcrypt.GenerateFromPassword([]byte(initSecret), bcrypt.MinCost)
		}})
	j, _, err := srv.startOrAttach(req, ms, wantID)
	if err != nil || j.result.GetDone() == nil {
		t.Fatalf("after restart: %v, %v", j, err)
	}
}

func TestLockedNodeRefusesInit(t *testing.T) {
	e := newEnv(t)
	lock := nodelock.New(e.tpm.Open, &pcrlog.Log{Path: filepath.Join(t.TempDir(), "m.log")})
	if ok, err := lock.TryLock([]byte("joined another cluster")); err != nil || !ok {
		t.Fatal(err)
	}
	_, err := e.collect(context.Background(), request(1))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "already belongs to a cluster") {
		t.Fatalf("err = %v", err)
	}
	if len(e.disk.rekeys) != 0 {
		t.Fatal("disk re-keyed on a locked node")
	}
}

func TestKubeadmFailureReportsJournal(t *testing.T) {
	e := newEnv(t)
	e.cluster.err = errors.New("exit status 1")
	msgs, err := e.collect(context.Background(), request(1))
	if err != nil {
		t.Fatal(err)
	}
	f := msgs[len(msgs)-1].GetFailed()
	if f == nil || !strings.Contains(f.GetErrorMessage(), "run kubeadm init: exit status 1") || string(f.GetJournal()) != "journal lines\n" {
		t.Fatalf("final message %v, want a failure with the journal", msgs[len(msgs)-1])
	}
	if st := e.statusLines(); len(st) == 0 || st[len(st)-1] != "init failed: run kubeadm init" {
		t.Fatalf("last status told systemd: %q, want the failed step", st)
	}
	var sawLog bool
	for _, m := range msgs {
		if l := m.GetLog(); l != nil && l.GetSource() == "kubeadm" {
			sawLog = true
		}
	}
	if !sawLog {
		t.Error("kubeadm output was not streamed")
	}
}

// dropDuringKubeadm starts an init, lets its owner go away while kubeadm
// runs, then lets kubeadm finish with nobody watching.
func (e *env) dropDuringKubeadm(t *testing.T, req *initpb.InitRequest) {
	t.Helper()
	e.cluster.release = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := e.client.Init(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel()
	// The server notices a dropped owner long before kubeadm ends.
	time.Sleep(200 * time.Millisecond)
	close(e.cluster.release)
}

// An owner whose connection dropped must find the daemon still there to
// hand over the result: bootstrapperd stops when Bootstrapped is called.
func TestFinishedInitWaitsForItsOwner(t *testing.T) {
	e := newEnv(t)
	req := request(1)
	e.dropDuringKubeadm(t, req)
	select {
	case <-e.bootstrapped:
		t.Fatal("the daemon was told to stop before the owner had the result")
	case <-time.After(300 * time.Millisecond):
	}
	msgs, err := e.collect(context.Background(), req)
	if err != nil || msgs[len(msgs)-1].GetDone() == nil {
		t.Fatalf("retry: %v", err)
	}
	select {
	case <-e.bootstrapped:
	case <-time.After(5 * time.Second):
		t.Fatal("not bootstrapped after the owner got the result")
	}
}

// An owner that hangs up the moment it has the result, as orrery init
// does, still lets the daemon stop at once (and close port 9000). Here the
// server's Send of the result returns only after the owner hung up: the
// slowest the node's side can be, as under emulation, where the daemon
// then kept serving for its whole hand-over grace.
func TestOwnerHangingUpAtOnceStillStopsTheDaemon(t *testing.T) {
	e := newEnv(t)
	e.intercept = func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, slowResultSend{ss})
	}
	e.serve(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := e.client.Init(ctx, request(1))
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("init: %v", err)
		}
		if m.GetDone() != nil {
			cancel()
			break
		}
	}
	select {
	case <-e.bootstrapped:
	case <-time.After(5 * time.Second):
		t.Fatal("the owner has its result, yet the daemon still waits for the owner to come for it")
	}
}

// slowResultSend returns from sending a final result only once the
// client has gone.
type slowResultSend struct{ grpc.ServerStream }

func (s slowResultSend) SendMsg(m any) error {
	err := s.ServerStream.SendMsg(m)
	if r, ok := m.(*initpb.InitResponse); ok && (r.GetDone() != nil || r.GetFailed() != nil) {
		select {
		case <-s.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}
	return err
}

func TestFinishedInitStopsAfterGrace(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.HandOverGrace = 50 * time.Millisecond })
	e.dropDuringKubeadm(t, request(1))
	select {
	case <-e.bootstrapped:
	case <-time.After(5 * time.Second):
		t.Fatal("an init nobody came back for never let the daemon stop")
	}
}

// clusterID is what the node derives from req.
func clusterID(t *testing.T, req *initpb.InitRequest) []byte {
	t.Helper()
	msec, err := keys.MasterSecret{Key: req.MasterSecret, Salt: req.MasterSecretSalt}.MeasurementSecret()
	if err != nil {
		t.Fatal(err)
	}
	id, err := keys.ClusterID(msec, req.MeasurementSalt)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// The daemon dies while kubeadm runs, after the point of no return; the
// restarted daemon must finish the init for its owner and nobody else.
func TestRestartAfterLockFinishesInit(t *testing.T) {
	e := newEnv(t)
	req := request(1)
	e.cluster.release = make(chan struct{})
	e.cluster.killed = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := e.client.Init(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		if m.GetProgress().GetPhase() == "kubeadm-init" {
			break
		}
	}
	cancel()
	close(e.cluster.killed)
	e.restart(t)

	if !interrupted(t, e.cfg) {
		t.Fatal("after a restart in kubeadm, the records and the lock do not show the init interrupted")
	}
	rec, err := os.ReadFile(filepath.Join(filepath.Dir(e.resultPath), "init-request.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range [][]byte{req.MasterSecret, req.MasterSecretSalt, req.InitSecret} {
		if bytes.Contains(rec, secret) || strings.Contains(string(rec), base64.StdEncoding.EncodeToString(secret)) {
			t.Fatal("the init request record holds a secret")
		}
	}

	// Another owner cannot take the interrupted init over, nor erase it.
	for name, other := range map[string]*initpb.InitRequest{"other master secret": request(7), "other salt": func() *initpb.InitRequest {
		r := request(1)
		r.MeasurementSalt = bytes.Repeat([]byte{9}, 32)
		return r
	}()} {
		if _, err := e.collect(context.Background(), other); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("%s after the restart: %v, want FailedPrecondition", name, err)
		}
	}

	msgs, err := e.collect(context.Background(), req)
	if err != nil {
		t.Fatalf("the owner's retry after the restart: %v", err)
	}
	final := msgs[len(msgs)-1].GetDone()
	wantID := clusterID(t, req)
	if final == nil || !bytes.Equal(final.GetClusterId(), wantID) {
		t.Fatalf("retry ended with %v, want success for cluster %x", msgs[len(msgs)-1], wantID)
	}
	select {
	case <-e.bootstrapped:
	case <-time.After(5 * time.Second):
		t.Fatal("the finished init never let the daemon stop")
	}
	ms := keys.MasterSecret{Key: req.MasterSecret, Salt: req.MasterSecretSalt}
	if e.cluster.resets != 1 || e.cluster.inits != 1 || len(e.cluster.stored) != 1 || !bytes.Equal(e.cluster.stored[0].Key, ms.Key) {
		t.Fatalf("after the restart kubeadm was reset %d times, run %d times, the master secret stored %d times; want 1, 1, 1",
			e.cluster.resets, e.cluster.inits, len(e.cluster.stored))
	}
	if got := e.pcr15(t); !bytes.Equal(got, nodelock.Expected(wantID)) {
		t.Fatalf("PCR 15 = %x, want %x: the node must be locked exactly once, to its owner's cluster", got, nodelock.Expected(wantID))
	}
	if interrupted(t, e.cfg) {
		t.Fatal("after the init finished, the records and the lock still show it interrupted")
	}
}

// interrupted is how bootstrapperd (its nodestate) tells an init that an
// earlier run left after the node lock.
func interrupted(t *testing.T, cfg Config) bool {
	t.Helper()
	id := Unfinished(cfg)
	if id == nil {
		return false
	}
	mine, err := cfg.Lock.LockedTo(id)
	if err != nil {
		t.Fatal(err)
	}
	return mine
}

func TestUnfinished(t *testing.T) {
	id := clusterID(t, request(1))
	tests := map[string]struct {
		// request and result are the records' contents; "" writes none.
		request, result string
		want            []byte
	}{
		"fresh node":       {},
		"request recorded": {request: `{"clusterName":"demo","clusterID":"` + base64.StdEncoding.EncodeToString(id) + `"}`, want: id},
		"init finished": {
			request: `{"clusterName":"demo","clusterID":"` + base64.StdEncoding.EncodeToString(id) + `"}`,
			result:  `{"clusterID":"` + base64.StdEncoding.EncodeToString(id) + `","kubeconfig":"a3ViZWNvbmZpZw=="}`,
		},
		"damaged request": {request: `{"clusterID":`},
		// The owner's retry runs the init again (see startOrAttach).
		"damaged result": {
			request: `{"clusterName":"demo","clusterID":"` + base64.StdEncoding.EncodeToString(id) + `"}`,
			result:  `{"clusterID":`,
			want:    id,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{ResultPath: filepath.Join(dir, "init-result.json")}
			for path, content := range map[string]string{filepath.Join(dir, "init-request.json"): tc.request, cfg.ResultPath: tc.result} {
				if content == "" {
					continue
				}
				if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if got := Unfinished(cfg); !bytes.Equal(got, tc.want) {
				t.Fatalf("Unfinished = %x, want %x", got, tc.want)
			}
		})
	}
}

// The records an init keeps are the state disk's only account of it, and
// must survive a crash whole and readable by bootstrapperd alone.
func TestRecordsAreWrittenWholeAndPrivate(t *testing.T) {
	dir := t.TempDir()
	s := New(Config{ResultPath: filepath.Join(dir, "state", "init-result.json")})
	id := clusterID(t, request(1))
	if err := s.saveRequest(pending{ClusterParams: ClusterParams{ClusterName: "demo", ClusterID: id}}); err != nil {
		t.Fatal(err)
	}
	if err := s.saveResult(result{ClusterID: id, Kubeconfig: []byte("kubeconfig")}); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{s.requestPath(), s.cfg.ResultPath} {
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, %v; want mode 0600", path, st, err)
		}
	}
	entries, err := os.ReadDir(filepath.Dir(s.cfg.ResultPath))
	if err != nil || len(entries) != 2 {
		t.Fatalf("the state directory holds %v (%v); want the two records and no temporary file", entries, err)
	}
	if r, ok := s.loadResult(); !ok || !bytes.Equal(r.ClusterID, id) {
		t.Fatalf("loadResult = %v, %v", r, ok)
	}
}
