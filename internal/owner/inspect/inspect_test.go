package inspect

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/atls/atlstest"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/inspectserver"
	"github.com/orrery-dev/orrery/internal/owner/dialer"
	"github.com/orrery-dev/orrery/internal/owneraccess"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
)

type noJournal struct{}

func (noJournal) Read(context.Context, inspectserver.Query, func([]*inspectpb.JournalEntry) error) error {
	return nil
}

// serve runs a node's service on n for the owner's key pub.
func serve(t *testing.T, n *qemutest.Node, pub ed25519.PublicKey) string {
	t.Helper()
	owner := func() (ed25519.PublicKey, error) { return pub, nil }
	svc, err := inspectserver.New(inspectserver.Config{
		Owner: owner, Journal: noJournal{},
		Status: func() *inspectpb.StatusResponse { return &inspectpb.StatusResponse{NodeName: "worker-0"} },
	})
	if err != nil {
		t.Fatal(err)
	}
	return atlstest.Serve(t, atls.Config{Issuer: n.Issuer, AuthorizeClient: owneraccess.Authorize(owner)},
		func(s *grpc.Server) { inspectpb.RegisterInspectServiceServer(s, svc) })
}

// image is the measurements of a node that booted name.
func image(t *testing.T, name string) policy.Policy {
	t.Helper()
	m := measurements.M{}
	for pcr, v := range qemutest.NewNode(t).Boot(t, name, name).PCRs(t) {
		if pcr == 4 || pcr == 9 || pcr == 11 || pcr == 15 {
			m[pcr] = measurements.Measurement{Expected: v}
		}
	}
	return policy.Policy{PCRs: m}
}

func TestDialChecksImageClusterAndOwner(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	n := qemutest.NewNode(t).Boot(t, "image-2", "image-2").Lock(t, "cluster-a")
	addr := serve(t, n, pub)
	owner := Owner{
		Key:         key,
		ClusterID:   []byte("cluster-a"),
		Images:      []Image{{Name: "old.json", Policy: image(t, "image-1")}, {Name: "new.json", Policy: image(t, "image-2")}},
		PlatformCAs: []*x509.Certificate{n.CA.Cert},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	got, err := owner.Dial(ctx, addr, "")
	if err != nil {
		t.Fatalf("the owner's node was refused: %v", err)
	}
	defer got.Close()
	if got.Image != "new.json" || !got.Locked || got.Status.GetNodeName() != "worker-0" || got.Instance != n.Instance {
		t.Fatalf("node matched %q (locked %v), said %v, instance %v", got.Image, got.Locked, got.Status, got.Instance)
	}

	// A node of the image waiting in its initrd (PCR 15 zero) answers
	// too, and says it is not locked.
	waiting := qemutest.NewNodeOf(t, n.CA).Boot(t, "image-2", "image-2")
	w, err := owner.Dial(ctx, serve(t, waiting, pub), "")
	if err != nil {
		t.Fatalf("a node of the owner's image in its initrd: %v", err)
	}
	defer w.Close()
	if w.Locked || w.Image != "new.json" {
		t.Fatalf("a waiting node: locked %v, image %q", w.Locked, w.Image)
	}

	otherCluster := owner
	otherCluster.ClusterID = []byte("cluster-b")
	_, err = otherCluster.Dial(ctx, addr, "")
	var notAttested *dialer.NotAttestedError
	if !errors.As(err, &notAttested) || !strings.Contains(err.Error(), "PCR 15") {
		t.Errorf("a node of another cluster: %v, want a refusal that names PCR 15", err)
	}

	oldOnly := owner
	oldOnly.Images = owner.Images[:1]
	if _, err := oldOnly.Dial(ctx, addr, ""); !errors.As(err, &notAttested) {
		t.Errorf("a node of a retired image: %v, want a refusal", err)
	}

	stranger := owner
	_, stranger.Key, _ = ed25519.GenerateKey(rand.Reader)
	if _, err := stranger.Dial(ctx, addr, ""); err == nil || !strings.Contains(err.Error(), "answers only its owner") {
		t.Errorf("a caller with another key: %v, want the node's refusal", err)
	}
}

// twoWorkers are worker-0 and worker-1, genuine nodes of the owner's
// image locked to the owner's cluster, their platform's CA, and the
// owner, whose access key pub is.
func twoWorkers(t *testing.T) (owner Owner, pub ed25519.PublicKey, ca *platformca.CA, worker0, worker1 *qemutest.Node) {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca = qemutest.NewNode(t).CA
	worker0 = qemutest.NewInstance(t, ca, platformca.NewInstance("worker-0")).Boot(t, "image", "image").Lock(t, "cluster-a")
	worker1 = qemutest.NewInstance(t, ca, platformca.NewInstance("worker-1")).Boot(t, "image", "image").Lock(t, "cluster-a")
	owner = Owner{
		Key: key, ClusterID: []byte("cluster-a"),
		Images:      []Image{{Name: "image.json", Policy: image(t, "image")}},
		PlatformCAs: []*x509.Certificate{ca.Cert},
	}
	return owner, pub, ca, worker0, worker1
}

// TestDialChecksWhoAnswered is root on worker-0 rewriting its Node's
// address to worker-1's: both are genuine nodes of the owner's image and
// cluster, and worker-1's inspect service even calls itself worker-0 (its
// status is its own word). Asked for worker-0, the owner must refuse the
// node at that address, since its attestation proves it is worker-1.
func TestDialChecksWhoAnswered(t *testing.T) {
	owner, pub, ca, worker0, worker1 := twoWorkers(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr0, addr1 := serve(t, worker0, pub), serve(t, worker1, pub)

	n, err := owner.Dial(ctx, addr0, "worker-0")
	if err != nil {
		t.Fatalf("worker-0 at its own address: %v", err)
	}
	n.Close()

	_, err = owner.Dial(ctx, addr1, "worker-0")
	var wrong *WrongNodeError
	if !errors.As(err, &wrong) || wrong.Got != worker1.Instance || !strings.Contains(err.Error(), "worker-1") {
		t.Fatalf("worker-0's name at worker-1's address: %v, want a refusal naming worker-1", err)
	}

	// Named by address, any node of the cluster answers, and it is known
	// by the instance it proved, not by what it says.
	n, err = owner.Dial(ctx, addr1, "")
	if err != nil {
		t.Fatalf("worker-1 by address: %v", err)
	}
	defer n.Close()
	if n.Instance.Name != "worker-1" || n.Status.GetNodeName() != "worker-0" {
		t.Fatalf("by address: proved %v, said %q", n.Instance, n.Status.GetNodeName())
	}

	// A node whose platform certified no instance cannot be told apart.
	anon := qemutest.NewInstance(t, ca, attestation.Instance{}).Boot(t, "image", "image").Lock(t, "cluster-a")
	if _, err := owner.Dial(ctx, serve(t, anon, pub), "worker-0"); !errors.As(err, &wrong) || !wrong.Got.IsZero() {
		t.Fatalf("a node with no certified instance, named: %v, want a refusal", err)
	}
}

// relay forwards each connection to the address it is set to, as the
// network between the owner and a node may; cut drops every connection
// it forwarded, so that gRPC dials again.
type relay struct {
	lis   net.Listener
	mu    sync.Mutex
	to    string
	conns []net.Conn
}

func newRelay(t *testing.T, to string) *relay {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{lis: lis, to: to}
	t.Cleanup(func() { lis.Close(); r.cut() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			to := r.to
			r.mu.Unlock()
			up, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, c, up)
			r.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return r
}

func (r *relay) set(to string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.to = to
}

func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.Close()
	}
	r.conns = nil
}

// TestARedialReachesTheSameNode: a connection the owner checked is worth
// only as much as its next handshake. Whoever can cut the owner's TCP
// connection and answer the redial (the hypervisor's network, with a
// genuine node of the cluster behind it, as root on a worker has) must
// not receive the calls meant for the node first checked, nor answer
// them.
func TestARedialReachesTheSameNode(t *testing.T) {
	owner, pub, _, worker0, worker1 := twoWorkers(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := newRelay(t, serve(t, worker0, pub))
	n, err := owner.Dial(ctx, r.lis.Addr().String(), "worker-0")
	if err != nil {
		t.Fatalf("worker-0: %v", err)
	}
	defer n.Close()
	call := func() error {
		_, err := n.Client.Status(ctx, &inspectpb.StatusRequest{})
		return err
	}

	// The same node again, after a cut: the call goes through.
	r.cut()
	if err := eventually(call, func(err error) bool { return err == nil }); err != nil {
		t.Fatalf("worker-0 after a redial: %v", err)
	}

	r.set(serve(t, worker1, pub))
	r.cut()
	err = eventually(call, func(err error) bool { return err != nil && strings.Contains(err.Error(), "another machine answered") })
	if err == nil || !strings.Contains(err.Error(), "instance worker-1") {
		t.Fatalf("worker-1 answering the redial: %v, want a refusal naming it", err)
	}
}

// eventually calls f until done says its error is the one expected (gRPC
// may first report the cut connection itself), for up to 20 tries.
func eventually(f func() error, done func(error) bool) error {
	var err error
	for range 20 {
		if err = f(); done(err) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
	return err
}
