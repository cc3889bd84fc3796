package unlock

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/atls/atlstest"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/owner"
	"github.com/orrery-dev/orrery/internal/owner/dialer"
	"github.com/orrery-dev/orrery/internal/proto/recoverpb"
	"github.com/orrery-dev/orrery/internal/testkit/syncbuffer"
)

// serveRecovery serves s over attested TLS in which node attests, as the
// initrd does, and returns the address.
func serveRecovery(t *testing.T, node *qemutest.Node, s *RecoverServer) string {
	t.Helper()
	return atlstest.Serve(t, atls.Config{Issuer: node.Issuer}, func(srv *grpc.Server) { recoverpb.RegisterRecoverServiceServer(srv, s) },
		grpc.MaxRecvMsgSize(4096))
}

// testClusterCA is a cluster CA certificate (DER), as the owner's admin
// kubeconfig holds it.
func testClusterCA(t *testing.T) []byte {
	t.Helper()
	ca, err := platformca.New("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	return ca.Cert.Raw
}

const testEndpoint = "10.42.1.100:6443"

// withCluster is the owner's recovery request: ms and the cluster.
func withCluster(t *testing.T, ms keys.MasterSecret) *recoverpb.RecoverRequest {
	return &recoverpb.RecoverRequest{MasterSecret: ms.Key, MasterSecretSalt: ms.Salt, ClusterCaCert: testClusterCA(t), ApiServerEndpoint: testEndpoint}
}

// recoverConfig is the owner's recovery of node, which its records name
// as the control plane, at addr with ms.
func recoverConfig(t *testing.T, node *qemutest.Node, addr string, ms keys.MasterSecret) owner.RecoverConfig {
	return owner.RecoverConfig{
		Node: addr, Measurements: policy.Policy{PCRs: imageOf(t, node)}, PlatformCA: node.CA.Cert, MasterSecret: ms,
		ControlPlane: node.Instance, CACert: testClusterCA(t), Endpoint: testEndpoint,
	}
}

func masterSecret(t *testing.T) keys.MasterSecret {
	t.Helper()
	ms, err := keys.GenerateMasterSecret(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// recoveryNode is a control plane waiting in its initrd: booted, PCR 15
// still zero, its disk opened by ms, serving recovery.
func recoveryNode(t *testing.T, ms keys.MasterSecret) (*qemutest.Node, *Unlocker, *fileLUKS, *syncbuffer.Buffer, string) {
	node := qemutest.NewNode(t).Boot(t, "image-1", "image-1")
	key, err := ms.DiskKey(diskUUID)
	if err != nil {
		t.Fatal(err)
	}
	u, luks := newDisk(t, key)
	var console syncbuffer.Buffer
	say := func(format string, args ...any) { fmt.Fprintf(&console, format+"\n", args...) }
	addr := serveRecovery(t, node, &RecoverServer{DiskUUID: diskUUID, Unlocker: u, Say: say})
	return node, u, luks, &console, addr
}

func TestRecoverWrongThenRightMasterSecret(t *testing.T) {
	ms := masterSecret(t)
	node, u, _, console, addr := recoveryNode(t, ms)
	before := header(t, u)
	var events strings.Builder
	cfg := recoverConfig(t, node, addr, ms)
	cfg.Progress = func(e owner.Event) { events.WriteString(e.Text + "\n") }
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	cfg.MasterSecret = masterSecret(t) // another cluster's
	if err := owner.Recover(ctx, cfg); !errors.Is(err, owner.ErrWrongMasterSecret) {
		t.Fatalf("Recover with another cluster's master secret = %v, want ErrWrongMasterSecret", err)
	}
	if isOpen(u) || !bytes.Equal(header(t, u), before) {
		t.Fatal("a wrong master secret opened the disk or changed its header")
	}
	if !strings.Contains(console.String(), "does not open the state disk") {
		t.Errorf("the console does not say why it refused:\n%s", console)
	}

	cfg.MasterSecret = ms
	if err := owner.Recover(ctx, cfg); err != nil {
		t.Fatalf("Recover with the cluster's master secret: %v", err)
	}
	if !isOpen(u) {
		t.Fatal("the disk is not open after a successful recovery")
	}
	want, _ := ms.MeasurementSecret()
	access, _ := ms.OwnerAccessKey()
	if got := u.Key(); !bytes.Equal(got.MeasurementSecret, want) || !strings.Contains(got.From, "the owner") || got.DiskKey != nil ||
		!access.Public().(ed25519.PublicKey).Equal(ed25519.PublicKey(got.OwnerAccessKey)) {
		t.Errorf("the unlocker keeps %+v; want the measurement secret, the owner's access key, the owner as sender, and no disk key", got)
	}
	if cl := u.Key().Cluster; cl == nil || !cl.ControlPlane || !bytes.Equal(cl.CACert, cfg.CACert) || cl.Endpoint != cfg.Endpoint {
		t.Errorf("the unlocker keeps the cluster %+v; want the owner's CA and endpoint, as a control plane", cl)
	}

	// A second recovery finds the node open and changes nothing.
	if err := owner.Recover(ctx, cfg); err != nil {
		t.Errorf("Recover of an opened node: %v", err)
	}
	for _, secret := range [][]byte{ms.Key, ms.Salt, cfg.MasterSecret.Key} {
		for _, where := range []string{console.String(), events.String()} {
			if strings.Contains(where, hex.EncodeToString(secret)) || strings.Contains(where, string(secret)) {
				t.Fatal("a master secret appears in the console or the owner's progress")
			}
		}
	}
}

// An attacker who forwards the recovery port to a node of another image
// (or to its own TLS server) does not get the master secret.
func TestRecoverRefusesAnotherImage(t *testing.T) {
	ms := masterSecret(t)
	genuine := qemutest.NewNode(t).Boot(t, "image-1", "image-1")
	impostor, u, luks, _, addr := recoveryNode(t, ms)
	impostor.Measure(t, 11, "a debug shell", "initrd: something else")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := recoverConfig(t, impostor, addr, ms)
	cfg.Measurements = policy.Policy{PCRs: imageOf(t, genuine)}
	err := owner.Recover(ctx, cfg)
	var notAttested *dialer.NotAttestedError
	if !errors.As(err, &notAttested) || !strings.Contains(err.Error(), "PCR 11") {
		t.Fatalf("Recover from a node of another image = %v, want a refusal naming PCR 11", err)
	}
	if isOpen(u) || luks.keyTests() != 0 {
		t.Error("the impostor received a master secret and tried it")
	}
}

func TestRecoverBadRequests(t *testing.T) {
	ms := masterSecret(t)
	key, _ := ms.DiskKey(diskUUID)
	u, luks := newDisk(t, key)
	s := &RecoverServer{DiskUUID: diskUUID, Unlocker: u, Say: func(string, ...any) {}}
	for name, req := range map[string]*recoverpb.RecoverRequest{
		"empty":       {},
		"short key":   {MasterSecret: ms.Key[:31], MasterSecretSalt: ms.Salt},
		"long salt":   {MasterSecret: ms.Key, MasterSecretSalt: append(bytes.Clone(ms.Salt), 0)},
		"salt only":   {MasterSecretSalt: ms.Salt},
		"key of 64 B": {MasterSecret: bytes.Repeat(ms.Key, 2), MasterSecretSalt: ms.Salt},
		"key of 16 B": {MasterSecret: ms.Key[:16], MasterSecretSalt: ms.Salt},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := s.Recover(context.Background(), req); status.Code(err) != codes.InvalidArgument {
				t.Errorf("Recover = %v, want InvalidArgument", err)
			}
		})
	}
	if isOpen(u) || luks.keyTests() != 0 {
		t.Error("a malformed request reached the disk")
	}
}

// Garbage and half-finished handshakes on the port leave the server
// serving.
func TestRecoverSurvivesGarbage(t *testing.T) {
	ms := masterSecret(t)
	node, u, _, _, addr := recoveryNode(t, ms)
	for _, junk := range [][]byte{nil, []byte("GET / HTTP/1.1\r\n\r\n"), bytes.Repeat([]byte{0x16, 0x03, 0x01, 0xff, 0xff}, 1000)} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(junk)
		c.Close()
	}
	stalled, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := owner.Recover(ctx, recoverConfig(t, node, addr, ms)); err != nil {
		t.Fatal(err)
	}
	if !isOpen(u) {
		t.Error("not open")
	}
}

// A request larger than the two 32-byte fields need is refused before the
// server decodes it.
func TestRecoverRefusesOversizedRequests(t *testing.T) {
	ms := masterSecret(t)
	node, u, luks, _, addr := recoveryNode(t, ms)
	conn := dialRecovery(t, node, addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := recoverpb.NewRecoverServiceClient(conn).Recover(ctx, &recoverpb.RecoverRequest{MasterSecret: make([]byte, 64<<10), MasterSecretSalt: ms.Salt})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 64 KiB request: %v, want ResourceExhausted", err)
	}
	if isOpen(u) || luks.keyTests() != 0 {
		t.Error("an oversized request reached the disk")
	}
}

// dialRecovery connects to the recovery server at addr as the owner's CLI
// does, checking node's attestation, until the test ends.
func dialRecovery(t *testing.T, node *qemutest.Node, addr string) *grpc.ClientConn {
	t.Helper()
	d, err := dialer.New(validatorOf(t, node))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := d.Conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestRecoverGoesToTheRecordedControlPlaneOnly is the host relabelling a
// worker a control plane in its metadata, so that the worker's initrd
// serves recovery, and pointing the owner's 'recover' at it: the worker
// runs the genuine image, but its certified instance is not the control
// plane the owner's workspace records, so it gets neither the master
// secret nor a control plane's latitude over what its disk keeps.
func TestRecoverGoesToTheRecordedControlPlanesOnly(t *testing.T) {
	ms := masterSecret(t)
	worker, u, luks, _, addr := recoveryNode(t, ms)
	cfg := recoverConfig(t, worker, addr, ms)
	cfg.ControlPlane = attestation.Instance{Name: "cp-0", ID: "4242"}
	cfg.ControlPlaneIDs = []string{"4243"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := owner.Recover(ctx, cfg)
	if !errors.Is(err, owner.ErrNotTheControlPlane) || !strings.Contains(err.Error(), worker.Instance.Name) {
		t.Fatalf("Recover of a node the workspace does not record = %v, want ErrNotTheControlPlane naming it", err)
	}
	if isOpen(u) || luks.keyTests() != 0 {
		t.Error("the relabelled worker received the master secret")
	}
	// Once the owner approved its instance as a control plane (and the
	// workspace recorded it), it is one, also after the first node was
	// removed (the workspace then names none).
	cfg.ControlPlane = attestation.Instance{}
	cfg.ControlPlaneIDs = append(cfg.ControlPlaneIDs, worker.Instance.ID)
	if err := owner.Recover(ctx, cfg); err != nil || !isOpen(u) {
		t.Fatalf("Recover of an approved control plane = %v, disk open %v", err, isOpen(u))
	}
}

// TestRecoverNeedsTheOwnersWordOnTheCluster: a request without the
// cluster's CA and API server (an older orrery), or with a CA that is
// none, is refused before the disk is touched; the node would otherwise
// keep what its disk holds on no one's word.
func TestRecoverNeedsTheOwnersWordOnTheCluster(t *testing.T) {
	ms := masterSecret(t)
	key, _ := ms.DiskKey(diskUUID)
	u, luks := newDisk(t, key)
	s := &RecoverServer{DiskUUID: diskUUID, Unlocker: u, Say: func(string, ...any) {}}
	notCA := withCluster(t, ms)
	notCA.ClusterCaCert = []byte("not a certificate")
	scheme := withCluster(t, ms)
	scheme.ApiServerEndpoint = "https://10.42.1.100:6443"
	for name, req := range map[string]*recoverpb.RecoverRequest{
		"no cluster":          {MasterSecret: ms.Key, MasterSecretSalt: ms.Salt},
		"no endpoint":         {MasterSecret: ms.Key, MasterSecretSalt: ms.Salt, ClusterCaCert: testClusterCA(t)},
		"garbage CA":          notCA,
		"endpoint with a URL": scheme,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := s.Recover(context.Background(), req); status.Code(err) != codes.InvalidArgument {
				t.Errorf("Recover = %v, want InvalidArgument", err)
			}
		})
	}
	if isOpen(u) || luks.keyTests() != 0 {
		t.Error("a request without the owner's word on the cluster reached the disk")
	}
}
