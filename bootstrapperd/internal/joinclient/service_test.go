package joinclient

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/role"
	"github.com/orrery-dev/orrery/internal/testkit/syncbuffer"
)

// The tests in this file are attacks by someone on the network between a
// joining node and its control planes: they answer on a control plane's
// join service port and hand the node a ticket whose disk key they know.
// The node must refuse before it sends its request (its disk UUID and
// CSR), and use nothing of the ticket.

// attackerTicket is what a fake join service hands out: a disk key, a
// cluster and a control-plane file of the attacker's choosing.
func attackerTicket() *joinpb.IssueJoinTicketResponse {
	t := ticket()
	t.StateDiskKey = bytes.Repeat([]byte{0xee}, 32)
	t.MeasurementSecret = bytes.Repeat([]byte{0xef}, 32)
	t.ControlPlaneFiles = []*joinpb.ControlPlaneFile{{Name: "ca.key", Data: []byte("attacker's CA")}}
	return t
}

// anyAttestation is the validator of a fake join service that wants the
// node to attest (as the real one does) but checks nothing.
type anyAttestation struct{}

func (anyAttestation) Variant() variant.Variant { return variant.QEMUVTPM }
func (anyAttestation) Validate(_ context.Context, doc, _ []byte) ([]byte, error) {
	d, err := vtpm.ParseDocument(doc)
	if err != nil {
		return nil, err
	}
	return d.UserData, nil
}

func TestJoinServiceMustProveItself(t *testing.T) {
	p := newPlatform(t)
	tests := map[string]struct {
		// service returns the fake join service's credentials.
		service func(t *testing.T) atls.Config
		// wantReason is what the refusal in the log must say.
		wantReason string
	}{
		"(a) does not attest": {
			service: func(*testing.T) atls.Config {
				return atls.Config{Validators: []attestation.Validator{anyAttestation{}}}
			},
			wantReason: "no attestation issuer",
		},
		"attests with a vTPM the platform did not certify": {
			// Same image, locked, every PCR right: only the key is its own.
			service: func(t *testing.T) atls.Config {
				return atls.Config{Issuer: newPlatform(t).controlPlane(t, "image-1").Issuer, Validators: []attestation.Validator{anyAttestation{}}}
			},
			wantReason: "not signed by the platform CA",
		},
		"(b) a control plane of another image (PCR 11)": {
			service: func(t *testing.T) atls.Config {
				return atls.Config{Issuer: lockNode(t, p.node(t, "image-1", "image-2")).Issuer, Validators: []attestation.Validator{anyAttestation{}}}
			},
			wantReason: "PCR 11 mismatch",
		},
		"(c) a genuine node of this image locked to no cluster (PCR 15 zero)": {
			service: func(t *testing.T) atls.Config {
				return atls.Config{Issuer: p.bootedNode(t, "image-1").Issuer, Validators: []attestation.Validator{anyAttestation{}}}
			},
			wantReason: "PCR 15 is zero",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			self := p.bootedNode(t, "image-1")
			fake := &joinService{resp: attackerTicket()}
			cfg := nodeConfig(t, self, role.ControlPlane, []metadata.Instance{cp0})
			cfg.dialNet = route(map[netip.Addr]string{cp0.IP: serveJoin(t, tc.service(t), fake)})
			var logs syncbuffer.Buffer
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// One attempt: stop at the first pause.
			cfg.after = func(time.Duration) <-chan time.Time { cancel(); return nil }

			if err := Run(ctx, cfg); !errors.Is(err, context.Canceled) {
				t.Errorf("Run = %v, want it still trying (context.Canceled)", err)
			}
			if !strings.Contains(logs.String(), "refused a join service") || !strings.Contains(logs.String(), tc.wantReason) {
				t.Errorf("the log does not say the service was refused because %q:\n%s", tc.wantReason, logs.String())
			}
			if _, calls := fake.requests(); calls != 0 {
				t.Errorf("the node sent its request (disk UUID, CSR) to a service that proved nothing (%d calls)", calls)
			}
			noTicketUsed(t, cfg)
		})
	}
}

// noTicketUsed fails t if anything of a ticket reached the node: the lock,
// the disk, kubeadm, or a file.
func noTicketUsed(t *testing.T, cfg Config) {
	t.Helper()
	if l := cfg.Lock.(*lock); !l.free {
		t.Errorf("the node was locked to %x", l.id)
	}
	if d := cfg.Disk.(*disk); d.key != nil {
		t.Error("the state disk was re-keyed")
	}
	if j := cfg.Joiner.(*joiner); j.p != nil || j.resets != 0 {
		t.Errorf("kubeadm ran: join %+v, %d resets", j.p, j.resets)
	}
	for _, dir := range []string{cfg.StateDir, cfg.KubeletPKIDir, cfg.PKIDir} {
		filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				t.Errorf("wrote %s", path)
			}
			return nil
		})
	}
}

// A refused service does not stop the node: it goes on to the next
// control plane, and joins through the genuine one.
func TestRefusedServiceThenGenuineJoins(t *testing.T) {
	p := newPlatform(t)
	self := p.bootedNode(t, "image-1")
	fake := &joinService{resp: attackerTicket()}
	fakeAddr := serveJoin(t, atls.Config{Issuer: lockNode(t, p.node(t, "image-1", "image-2")).Issuer, Validators: []attestation.Validator{anyAttestation{}}}, fake)
	genuine := &joinService{resp: ticket()}
	genuineAddr := genuineService(t, p.controlPlane(t, "image-1"), self, genuine)
	cp1 := metadata.Instance{Name: "cp-1", Role: role.ControlPlane, IP: netip.MustParseAddr("10.42.1.101")}
	cfg := nodeConfig(t, self, role.Worker, []metadata.Instance{cp0, cp1})
	cfg.dialNet = route(map[netip.Addr]string{cp0.IP: fakeAddr, cp1.IP: genuineAddr})
	var logs syncbuffer.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))

	if err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if d := cfg.Disk.(*disk); !bytes.Equal(d.key, ticket().StateDiskKey) {
		t.Fatal("the disk was not re-keyed with the genuine service's key")
	}
	if _, calls := fake.requests(); calls != 0 {
		t.Fatalf("the refused service got %d requests", calls)
	}
	if !strings.Contains(logs.String(), "10.42.1.100:30090") || !strings.Contains(logs.String(), "PCR 11 mismatch") {
		t.Fatalf("the refusal of cp-0 is not logged with its address and the PCR:\n%s", logs.String())
	}
	if _, err := os.Stat(filepath.Join(cfg.PKIDir, "ca.key")); err == nil {
		t.Fatal("a worker got the attacker's control-plane file")
	}
}

// Without a platform CA the client would have nothing to check the
// service's key against: it refuses to run rather than trust anyone.
func TestJoinClientNeedsPlatformCA(t *testing.T) {
	p := newPlatform(t)
	cfg := nodeConfig(t, p.bootedNode(t, "image-1"), role.Worker, []metadata.Instance{cp0})
	cfg.PlatformCAs = nil
	if err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "platform CA") {
		t.Fatalf("Run = %v, want a refusal to run without a platform CA", err)
	}
}
