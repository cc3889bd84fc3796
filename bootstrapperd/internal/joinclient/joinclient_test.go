package joinclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
)

type meta struct{ self Instance }

func (m meta) Self(context.Context) (Instance, error) { return m.self, nil }
func (m meta) Peers(context.Context) ([]Instance, error) {
	return []Instance{{Name: "cp-0", Role: "control-plane", IP: netip.MustParseAddr("10.42.1.100")}, m.self}, nil
}

type ticketClient struct {
	joinpb.JoinServiceClient
	resp *joinpb.IssueJoinTicketResponse
	got  *joinpb.IssueJoinTicketRequest
}

func (c *ticketClient) IssueJoinTicket(_ context.Context, req *joinpb.IssueJoinTicketRequest, _ ...grpc.CallOption) (*joinpb.IssueJoinTicketResponse, error) {
	c.got = req
	return c.resp, nil
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

type lock struct {
	free bool
	id   []byte
}

func (l *lock) TryLock(id []byte) (bool, error) {
	if !l.free {
		return false, nil
	}
	l.free, l.id = false, id
	return true, nil
}

func (l *lock) LockedTo(id []byte) (bool, error) { return !l.free && bytes.Equal(l.id, id), nil }

type disk struct{ key []byte }

func (d *disk) UUID(context.Context) (string, error) {
	return "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f", nil
}
func (d *disk) Rekey(_ context.Context, k []byte) error { d.key = k; return nil }

type joiner struct {
	p      *JoinParams
	fail   int // fail this many joins first
	resets int
}

func (j *joiner) Join(_ context.Context, p JoinParams, _ io.Writer) error {
	if j.fail > 0 {
		j.fail--
		return errors.New("kubeadm join: exit status 1")
	}
	j.p = &p
	return nil
}

func (j *joiner) Reset(context.Context, io.Writer) error { j.resets++; return nil }

func ticket() *joinpb.IssueJoinTicketResponse {
	return &joinpb.IssueJoinTicketResponse{
		StateDiskKey: bytes.Repeat([]byte{5}, 32), MeasurementSalt: bytes.Repeat([]byte{6}, 32),
		MeasurementSecret: bytes.Repeat([]byte{7}, 32), KubeletCert: []byte("der"),
		ApiServerEndpoint: "10.42.1.100:6443", Token: "abcdef.0123456789abcdef", DiscoveryTokenCaCertHash: "sha256:aa",
	}
}

func setup(t *testing.T, role string, resp *joinpb.IssueJoinTicketResponse, failFirst bool) (Config, *ticketClient, *lock, *disk, *joiner) {
	dir := t.TempDir()
	client := &ticketClient{resp: resp}
	var calls atomic.Int32
	cfg := Config{
		Metadata: meta{self: Instance{Name: "worker-0", Role: role, IP: netip.MustParseAddr("10.42.2.100")}},
		Dial: func(_ context.Context, addr string) (joinpb.JoinServiceClient, io.Closer, error) {
			if addr != "10.42.1.100:30090" {
				t.Errorf("dialled %s", addr)
			}
			if calls.Add(1) == 1 && failFirst {
				return nil, nil, errors.New("connection refused")
			}
			return client, nopCloser{}, nil
		},
		Lock: &lock{free: true}, Disk: &disk{}, Joiner: &joiner{},
		StateDir: filepath.Join(dir, "state"), KubeletPKIDir: filepath.Join(dir, "kubelet"), PKIDir: filepath.Join(dir, "pki"),
		Retry: 10 * time.Millisecond,
	}
	return cfg, client, cfg.Lock.(*lock), cfg.Disk.(*disk), cfg.Joiner.(*joiner)
}

func TestJoinWorker(t *testing.T) {
	cfg, client, l, d, j := setup(t, "worker", ticket(), true)
	if err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	wantID, _ := keys.ClusterID(bytes.Repeat([]byte{7}, 32), bytes.Repeat([]byte{6}, 32))
	if !bytes.Equal(l.id, wantID) {
		t.Fatalf("locked to %x, want %x", l.id, wantID)
	}
	if !bytes.Equal(d.key, bytes.Repeat([]byte{5}, 32)) {
		t.Fatal("disk not re-keyed with the ticket's key")
	}
	if client.got.GetIsControlPlane() || client.got.GetDiskUuid() == "" || len(client.got.GetCertificateRequest()) == 0 {
		t.Fatalf("request %v", client.got)
	}
	if j.p == nil || j.p.Token != "abcdef.0123456789abcdef" || j.p.ControlPlane || j.p.NodeName != "worker-0" {
		t.Fatalf("kubeadm join params %+v", j.p)
	}
	if salt, _ := os.ReadFile(filepath.Join(cfg.StateDir, "measurement-salt")); !bytes.Equal(salt, bytes.Repeat([]byte{6}, 32)) {
		t.Fatal("measurement salt not kept for rejoin")
	}
	if st, err := os.Stat(filepath.Join(cfg.KubeletPKIDir, "kubelet.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("kubelet key: %v %v", st, err)
	}
}

func TestJoinLosesToInit(t *testing.T) {
	cfg, _, l, d, j := setup(t, "worker", ticket(), false)
	l.free = false
	if err := Run(context.Background(), cfg); !errors.Is(err, ErrLockLost) {
		t.Fatalf("err = %v, want ErrLockLost", err)
	}
	if d.key != nil || j.p != nil {
		t.Fatal("a node locked by init was re-keyed or joined")
	}
}

func TestControlPlaneFilesStayInPKIDir(t *testing.T) {
	tk := ticket()
	tk.ControlPlaneFiles = []*joinpb.ControlPlaneFile{{Name: "etcd/ca.crt", Data: []byte("ok")}, {Name: "../../etc/shadow", Data: []byte("x")}}
	cfg, _, l, _, j := setup(t, "control-plane", tk, false)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := Run(ctx, cfg)
	if err == nil || j.p != nil {
		t.Fatalf("err = %v, joined = %v; want a refusal", err, j.p != nil)
	}
	if !l.free {
		t.Fatal("a bad ticket took the node lock")
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(cfg.PKIDir), "etc")); err == nil {
		t.Fatal("a file was written outside the PKI directory")
	}
	tk.ControlPlaneFiles = tk.ControlPlaneFiles[:1]
	if err := Run(context.Background(), cfg); err != nil || j.p == nil || !j.p.ControlPlane {
		t.Fatalf("good control-plane ticket: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(cfg.PKIDir, "etcd", "ca.crt")); !strings.HasPrefix(string(got), "ok") {
		t.Fatal("the control-plane file was not written")
	}
}

func TestJoinRetriedAfterLockTakenFinishes(t *testing.T) {
	cfg, _, l, d, j := setup(t, "worker", ticket(), false)
	j.fail = 1
	if err := Run(context.Background(), cfg); err != nil {
		t.Fatalf("a join that failed after taking the lock did not finish on retry: %v", err)
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
	cfg, _, l, _, j := setup(t, "worker", ticket(), false)
	l.free, l.id = false, []byte("another cluster")
	if err := Run(context.Background(), cfg); !errors.Is(err, ErrLockLost) {
		t.Fatalf("err = %v, want ErrLockLost", err)
	}
	if j.resets != 0 || j.p != nil {
		t.Fatal("a node locked to another cluster was reset or joined")
	}
}

func TestRetriesBackOff(t *testing.T) {
	cfg, _, _, _, _ := setup(t, "worker", ticket(), false)
	failures := 6
	dial := cfg.Dial
	cfg.Dial = func(ctx context.Context, addr string) (joinpb.JoinServiceClient, io.Closer, error) {
		if failures > 0 {
			failures--
			return nil, nil, errors.New("connection refused")
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
