package inspectserver

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/atls/atlstest"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/owneraccess"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
	"github.com/orrery-dev/orrery/internal/tarfiles"
)

// fakeUnits stands in for systemd, which does not run where unit tests do;
// the e2e suite reads a real node's units.
type fakeUnits struct{}

func (fakeUnits) Units(_ context.Context, pattern string) ([]*inspectpb.Unit, error) {
	return []*inspectpb.Unit{{Name: "kubelet.service", LoadState: "loaded", ActiveState: "failed", SubState: "failed", Result: "exit-code"}}, nil
}

type node struct {
	addr       string
	owner      ed25519.PrivateKey
	validator  attestation.Validator
	statusRead atomic.Int32
}

// serveNode serves a node's InspectService over attested TLS from a swtpm
// node, with the journal of testJournal. authorizeInHandshake sets the
// handshake's check as the system's service does; the initrd's leaves it
// to the per-call check.
func serveNode(t *testing.T, authorizeInHandshake bool) *node {
	t.Helper()
	dir, _ := testJournal(t)
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{owner: priv}
	srv, err := New(Config{
		Owner:   func() (ed25519.PublicKey, error) { return pub, nil },
		Journal: Journalctl{Dir: dir},
		Units:   fakeUnits{},
		Usage: func() (*inspectpb.UsageResponse, error) {
			n.statusRead.Add(1)
			return Usage{}.Read()
		},
		Status: func() *inspectpb.StatusResponse {
			n.statusRead.Add(1)
			return &inspectpb.StatusResponse{NodeName: "worker-0", Stage: "system"}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	tn := qemutest.NewNode(t)
	cfg := atls.Config{Issuer: tn.Issuer}
	if authorizeInHandshake {
		cfg.AuthorizeClient = owneraccess.Authorize(func() (ed25519.PublicKey, error) { return pub, nil })
	}
	n.addr = atlstest.Serve(t, cfg, func(s *grpc.Server) { inspectpb.RegisterInspectServiceServer(s, srv) })
	zero := make([]byte, 32)
	n.validator, err = qemu.NewValidator(qemu.ValidatorConfig{
		Measurements: measurements.M{15: {Expected: zero}},
		PlatformCAs:  []*x509.Certificate{tn.CA.Cert},
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *node) client(t *testing.T, key ed25519.PrivateKey) inspectpb.InspectServiceClient {
	t.Helper()
	cfg := atls.Config{Validators: []attestation.Validator{n.validator}}
	if key != nil {
		cfg.ClientKey = key
	}
	creds, err := atls.NewCredentials(cfg)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(n.addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return inspectpb.NewInspectServiceClient(conn)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestOwnerReadsTheNode(t *testing.T) {
	n := serveNode(t, true)
	c := n.client(t, n.owner)
	st, err := c.Status(ctx(t), &inspectpb.StatusRequest{})
	if err != nil || st.GetNodeName() != "worker-0" {
		t.Fatalf("Status: %v, %v", st, err)
	}
	stream, err := c.Journal(ctx(t), &inspectpb.JournalRequest{Unit: "kubelet"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		b, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, messages(b.GetEntries())...)
	}
	if len(got) != 2 || got[1] != "kubelet stopped" {
		t.Fatalf("kubelet's journal: %q", got)
	}
	us, err := c.Units(ctx(t), &inspectpb.UnitsRequest{Pattern: "kube*"})
	if err != nil || len(us.GetUnits()) != 1 || us.GetUnits()[0].GetResult() != "exit-code" {
		t.Fatalf("Units: %v, %v", us, err)
	}
	if _, err := c.Units(ctx(t), &inspectpb.UnitsRequest{Pattern: "kube$(reboot)"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a pattern with shell characters: %v, want InvalidArgument", err)
	}
	u, err := c.Usage(ctx(t), &inspectpb.UsageRequest{})
	if err != nil || u.GetCpus() == 0 || len(u.GetProcesses()) == 0 {
		t.Fatalf("Usage: %d CPUs, %d processes, %v", u.GetCpus(), len(u.GetProcesses()), err)
	}
	stream, err = c.Journal(ctx(t), &inspectpb.JournalRequest{Unit: "--merge"})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a journalctl option as unit: %v, want InvalidArgument", err)
	}
}

func TestSupportBundle(t *testing.T) {
	n := serveNode(t, true)
	stream, err := n.client(t, n.owner).Support(ctx(t), &inspectpb.SupportRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	for {
		c, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		archive.Write(c.GetData())
	}
	files, err := tarfiles.Read(&archive)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"status.json":               "worker-0",
		"units.txt":                 "kubelet.service",
		"journal.log":               "kubelet[42]: kubelet stopped",
		"journal-previous-boot.log": "old kubelet line a",
		"kernel.log":                "Linux version 6.1",
	} {
		if !strings.Contains(files[name], want) {
			t.Errorf("%s lacks %q:\n%s", name, want, files[name])
		}
	}
	for name, content := range files {
		for _, secret := range []string{"abcdef.0123456789abcdef", "fakeKEYmaterial", "PRIVATE KEY"} {
			if strings.Contains(content, secret) {
				t.Errorf("%s holds %q", name, secret)
			}
		}
	}
}

// TestStrangersAreRefused: root on a worker, or anyone on the network,
// holds no owner key; whichever key they prove, and whether the refusal
// comes in the handshake (the system's service) or per call (the
// initrd's, which serves recovery to anyone beside it), they learn nothing.
func TestStrangersAreRefused(t *testing.T) {
	_, stranger, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, inHandshake := range []bool{true, false} {
		n := serveNode(t, inHandshake)
		for name, key := range map[string]ed25519.PrivateKey{"another key": stranger, "a fresh key": nil} {
			c := n.client(t, key)
			_, err := c.Status(ctx(t), &inspectpb.StatusRequest{})
			if err == nil || !strings.Contains(err.Error(), "answers only its owner") {
				t.Errorf("handshake check %v, %s: Status gave %v, want a refusal naming the owner", inHandshake, name, err)
			}
			if !inHandshake && status.Code(err) != codes.PermissionDenied {
				t.Errorf("per-call check, %s: %v, want PermissionDenied", name, err)
			}
			if u, err := c.Usage(ctx(t), &inspectpb.UsageRequest{}); err == nil {
				t.Errorf("handshake check %v, %s: Usage answered with %d processes", inHandshake, name, len(u.GetProcesses()))
			}
			stream, err := c.Support(ctx(t), &inspectpb.SupportRequest{})
			if err == nil {
				_, err = stream.Recv()
			}
			if err == nil || errors.Is(err, io.EOF) {
				t.Errorf("handshake check %v, %s: Support served a bundle", inHandshake, name)
			}
		}
		if got := n.statusRead.Load(); got != 0 {
			t.Errorf("handshake check %v: the node read its status or usage %d times for strangers", inHandshake, got)
		}
	}
}
