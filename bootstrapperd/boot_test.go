package main

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kuberelease/kubereleasetest"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/nodestate"
	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/nodeattest"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/logging"
	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/pendingjoin"
	"github.com/orrery-dev/orrery/internal/testkit/syncbuffer"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm/swtpmtest"
	"github.com/orrery-dev/orrery/internal/tpm/tpmdev"
)

// testBootstrapper is a bootstrapper whose files are in dir and whose TPM
// openTPM opens; it logs to logs.
func testBootstrapper(t *testing.T, openTPM tpmdev.Opener, dir string, logs *syncbuffer.Buffer) *bootstrapper {
	t.Helper()
	p := nodePaths()
	p.measurementLog = filepath.Join(dir, "measurements.log")
	p.firmwareLog = filepath.Join(dir, "none")
	p.bootstrappedMarker = filepath.Join(dir, "bootstrapped")
	p.stateDir = dir
	p.runDir = dir
	p.ownerKey = filepath.Join(dir, "owner-access-key.pem")
	p.root = kubereleasetest.Root(t).Root
	p.clusterVersion = filepath.Join(dir, "cluster-kubernetes-version")
	b, err := newBootstrapper(p, openTPM, logging.New(logging.Config{Output: logs}))
	if err != nil {
		t.Fatal(err)
	}
	b.notify = func(string) {}
	b.platform = func(context.Context) (nodeattest.Platform, error) {
		return nodeattest.Platform{Variant: variant.QEMUVTPM}, nil
	}
	return b
}

// serveOn runs b's server on lis, as run does, until ctx ends.
func serveOn(ctx context.Context, t *testing.T, b *bootstrapper, lis net.Listener) error {
	srv, healthSrv, err := b.server()
	if err != nil {
		return err
	}
	return b.serve(ctx, srv, healthSrv, lis, time.Now())
}

func TestServesAttestedTLSUntilCancelled(t *testing.T) {
	n := qemutest.NewNode(t)
	ca := n.CA
	var logs syncbuffer.Buffer
	b := testBootstrapper(t, n.TPM.Open, t.TempDir(), &logs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveOn(ctx, t, b, lis) }()

	zero := make([]byte, 32)
	v, err := qemu.NewValidator(qemu.ValidatorConfig{
		Measurements: measurements.M{11: {Expected: zero}, 15: {Expected: zero}},
		PlatformCAs:  []*x509.Certificate{ca.Cert},
	})
	if err != nil {
		t.Fatal(err)
	}
	creds, _ := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{v}})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ccancel()
	if _, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health check over attested TLS: %v", err)
	}
	if !strings.Contains(logs.String(), StatusWaiting) {
		t.Errorf("log does not say %q:\n%s", StatusWaiting, logs.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
}

// A client that holds a stream open (here a health Watch) must not keep
// the daemon alive once it is told to stop, as after bootstrapping.
func TestStopsDespiteAnOpenStream(t *testing.T) {
	n := qemutest.NewNode(t)
	var logs syncbuffer.Buffer
	b := testBootstrapper(t, n.TPM.Open, t.TempDir(), &logs)
	b.stopGrace = 500 * time.Millisecond
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, bootstrapped := context.WithCancel(context.Background())
	defer bootstrapped()
	done := make(chan error, 1)
	go func() { done <- serveOn(ctx, t, b, lis) }()

	zero := make([]byte, 32)
	v, err := qemu.NewValidator(qemu.ValidatorConfig{
		Measurements: measurements.M{11: {Expected: zero}, 15: {Expected: zero}},
		PlatformCAs:  []*x509.Certificate{n.CA.Cert},
	})
	if err != nil {
		t.Fatal(err)
	}
	creds, _ := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{v}})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
	defer wcancel()
	watch, err := healthpb.NewHealthClient(conn).Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatalf("first health status: %v", err)
	}

	stopAt := time.Now()
	bootstrapped()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
		if d := time.Since(stopAt); d > 5*time.Second {
			t.Errorf("stopping took %v with a stream open; want about %v", d, b.stopGrace)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not return while a client held a health Watch open")
	}
}

// A node whose initrd rejoined its cluster (the node lock taken there, the
// bootstrapped marker on the state disk) says which cluster and leaves.
func TestRejoinedNodeReportsItsClusterAndExits(t *testing.T) {
	tpm := swtpmtest.Start(t)
	dir := t.TempDir()
	mlog := &pcrlog.Log{Path: filepath.Join(dir, "measurements.log")}
	clusterID := []byte("0123456789abcdef0123456789abcdef")
	if ok, err := nodelock.New(tpm.Open, mlog).TryLock(clusterID); err != nil || !ok {
		t.Fatalf("TryLock: %v %v", ok, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bootstrapped"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var logs syncbuffer.Buffer
	b := testBootstrapper(t, tpm.Open, dir, &logs)
	var notified []string
	b.notify = func(s string) { notified = append(notified, s) }
	b.listen = "127.0.0.1:0"
	if err := run(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	want := "STATUS=rejoined cluster " + hex.EncodeToString(clusterID)
	if len(notified) != 1 || !strings.Contains(notified[0], want) || !strings.Contains(notified[0], "READY=1") {
		t.Errorf("sd_notify got %q, want READY=1 and %q", notified, want)
	}
	if !strings.Contains(logs.String(), "rejoined cluster "+hex.EncodeToString(clusterID)) {
		t.Errorf("log: %s", logs.String())
	}
}

// A node whose join a reboot interrupted after the node lock (locked, no
// bootstrapped marker, the join ticket kept) finishes that join instead of
// reporting a cluster whose kubelet was never configured. The kept ticket
// here is damaged: the daemon must say so and fail, not start kubelet.
func TestInterruptedJoinIsFinishedNotReportedRejoined(t *testing.T) {
	tpm := swtpmtest.Start(t)
	dir := t.TempDir()
	mlog := &pcrlog.Log{Path: filepath.Join(dir, "measurements.log")}
	if ok, err := nodelock.New(tpm.Open, mlog).TryLock([]byte("0123456789abcdef0123456789abcdef")); err != nil || !ok {
		t.Fatalf("TryLock: %v %v", ok, err)
	}
	if err := os.WriteFile(filepath.Join(dir, pendingjoin.File), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs syncbuffer.Buffer
	b := testBootstrapper(t, tpm.Open, dir, &logs)
	var notified []string
	b.notify = func(s string) { notified = append(notified, s) }
	b.listen = "127.0.0.1:0"
	err := run(context.Background(), b)
	if err == nil || !strings.Contains(err.Error(), pendingjoin.File) {
		t.Fatalf("run = %v, want the damaged record named", err)
	}
	if len(notified) != 1 || !strings.Contains(notified[0], "finishing a join") {
		t.Errorf("sd_notify got %q, want the interrupted join reported", notified)
	}
	if strings.Contains(logs.String(), "rejoined") {
		t.Errorf("the node was reported rejoined:\n%s", logs.String())
	}
}

// A daemon restarted after an init took the node lock must stay for that
// init's owner instead of leaving the node locked and without a cluster.
func TestInterruptedInitKeepsDaemon(t *testing.T) {
	n := qemutest.NewNode(t)
	dir := t.TempDir()
	clusterID := []byte("0123456789abcdef0123456789abcdef")
	record, _ := json.Marshal(map[string]any{"clusterID": clusterID, "clusterName": "demo"})
	if err := os.WriteFile(filepath.Join(dir, "init-request.json"), record, 0o600); err != nil {
		t.Fatal(err)
	}
	if ok, err := nodelock.New(n.TPM.Open, n.Log).TryLock(clusterID); err != nil || !ok {
		t.Fatalf("TryLock: %v %v", ok, err)
	}
	var logs syncbuffer.Buffer
	b := testBootstrapper(t, n.TPM.Open, dir, &logs)
	b.listen = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, b) }()
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(logs.String(), StatusWaiting); time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("the daemon left a node with an interrupted init (err %v):\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon never served:\n%s", logs.String())
		}
	}
	if !strings.Contains(logs.String(), "run 'orrery init' again") {
		t.Errorf("the log does not tell the operator what finishes the init:\n%s", logs.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

// A node that belongs to no cluster serves init with the join client
// beside it; stopped, the daemon returns only once the join client has
// stopped too (TestMain fails a goroutine left behind).
func TestFreshNodeWaitsForInitOrJoin(t *testing.T) {
	n := newInitNode(t, "w-1", "w-1")
	n.b.listen = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, n.b) }()
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(n.logs.String(), "no join ticket yet"); time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("run returned %v on a fresh node:\n%s", err, n.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the join client never ran:\n%s", n.logs.String())
		}
	}
	if !strings.Contains(n.logs.String(), StatusWaiting) {
		t.Errorf("the log does not say %q:\n%s", StatusWaiting, n.logs.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

// A node marked bootstrapped that its initrd did not lock is neither
// served nor reported rejoined: the daemon fails and says what to do.
func TestMarkedUnlockedNodeFails(t *testing.T) {
	tpm := swtpmtest.Start(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bootstrapped"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var logs syncbuffer.Buffer
	b := testBootstrapper(t, tpm.Open, dir, &logs)
	var notified []string
	b.notify = func(s string) { notified = append(notified, s) }
	b.listen = "127.0.0.1:0"
	if err := run(context.Background(), b); !errors.Is(err, nodestate.ErrMarkedUnlocked) {
		t.Fatalf("run = %v, want %v", err, nodestate.ErrMarkedUnlocked)
	}
	if len(notified) != 0 {
		t.Errorf("sd_notify got %q, want nothing", notified)
	}
}
