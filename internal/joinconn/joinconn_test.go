package joinconn_test

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/atls/atlstest"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/joinconn"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm/swtpmtest"
)

// joinService counts the requests that reached it.
type joinService struct {
	joinpb.UnimplementedJoinServiceServer
	calls atomic.Int32
}

func (s *joinService) IssueJoinTicket(context.Context, *joinpb.IssueJoinTicketRequest) (*joinpb.IssueJoinTicketResponse, error) {
	s.calls.Add(1)
	return &joinpb.IssueJoinTicketResponse{}, nil
}

// pcrsOf reads n's SHA-256 values of pcrs.
func pcrsOf(t *testing.T, n *qemutest.Node, pcrs ...uint32) measurements.M {
	t.Helper()
	rw := swtpmtest.Open(t, n.TPM)
	defer rw.Close()
	sel := tpm2.PCRSelection{Hash: tpm2.AlgSHA256}
	for _, pcr := range pcrs {
		sel.PCRs = append(sel.PCRs, int(pcr))
	}
	got, err := client.ReadPCRs(rw, sel)
	if err != nil {
		t.Fatal(err)
	}
	m := measurements.M{}
	for pcr, v := range got.GetPcrs() {
		m[pcr] = measurements.Measurement{Expected: v}
	}
	return m
}

// serve runs svc as cp's join service, which requires the joining node to
// attest as self does, and returns a DialNet that sends every address to
// it.
func serve(t *testing.T, cp, self *qemutest.Node, svc *joinService) func(context.Context, string) (net.Conn, error) {
	t.Helper()
	return serveAs(t, cp.Issuer, attestsAs(t, self), svc)
}

// attestsAs accepts a node that attests as self does.
func attestsAs(t *testing.T, self *qemutest.Node) attestation.Validator {
	t.Helper()
	v, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: pcrsOf(t, self, joinconn.ImagePCRs...), PlatformCAs: []*x509.Certificate{self.CA.Cert}})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// extendUnlogged extends pcr of n without a measurement-log entry, as
// systemd-stub does (it logs to the firmware's event log, which these
// nodes do not send).
func extendUnlogged(t *testing.T, n *qemutest.Node, pcr uint32, data string) {
	t.Helper()
	rw := swtpmtest.Open(t, n.TPM)
	defer rw.Close()
	digest := sha256.Sum256([]byte(data))
	if err := tpm2.PCRExtend(rw, tpmutil.Handle(pcr), tpm2.AlgSHA256, digest[:], ""); err != nil {
		t.Fatal(err)
	}
}

// The join service must show PCRs 12 and 13 zero: a host that boots the
// genuine UKI with a command line of its own (accepted by systemd-stub
// with Secure Boot off, and measured only into PCR 12) or with system
// extensions (PCR 13) shows this image's PCRs 4, 9 and 11, and must not
// pass as a join service. The node then sends it nothing.
func TestJoinServiceWithBootLoaderChangesIsRefused(t *testing.T) {
	for name, tc := range map[string]struct {
		// cpImage is the image the control plane booted; the node boots
		// image-1 and trusts cpImage on its command line if it differs.
		cpImage string
		boot    func(t *testing.T, cp *qemutest.Node)
		wantErr string
	}{
		"genuine": {cpImage: "image-1", boot: func(*testing.T, *qemutest.Node) {}},
		"command line from the boot loader in PCR 12": {cpImage: "image-1", wantErr: "PCR 12",
			boot: func(t *testing.T, cp *qemutest.Node) {
				cp.Measure(t, 12, "orrery.roothash=0123 console=ttyS0", "systemd-stub: kernel command line")
			}},
		"PCR 12 extended without a log entry": {cpImage: "image-1", wantErr: "PCR 12",
			boot: func(t *testing.T, cp *qemutest.Node) { extendUnlogged(t, cp, 12, "orrery.roothash=0123") }},
		"system extension in PCR 13": {cpImage: "image-1", wantErr: "PCR 13",
			boot: func(t *testing.T, cp *qemutest.Node) { extendUnlogged(t, cp, 13, "sysext.raw") }},
		"trusted image: genuine": {cpImage: "image-0", boot: func(*testing.T, *qemutest.Node) {}},
		"trusted image: command line from the boot loader": {cpImage: "image-0", wantErr: "PCR 12",
			boot: func(t *testing.T, cp *qemutest.Node) { extendUnlogged(t, cp, 12, "orrery.roothash=0123") }},
	} {
		t.Run(name, func(t *testing.T) {
			ca, err := platformca.New("test platform CA")
			if err != nil {
				t.Fatal(err)
			}
			self := qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-1")
			cp := qemutest.NewNodeOf(t, ca).Boot(t, tc.cpImage, tc.cpImage)
			tc.boot(t, cp)
			cp.Lock(t, "cluster ID")
			cmdline := "console=ttyS0"
			if tc.cpImage != "image-1" {
				trust, err := joinconn.TrustValue(pcrsOf(t, cp, joinconn.ImagePCRs...))
				if err != nil {
					t.Fatal(err)
				}
				cmdline += " " + joinconn.TrustParam + "=" + trust
			}
			svc := &joinService{}
			d, err := joinconn.New(joinconn.Config{
				Issuer: self.Issuer, OpenTPM: self.TPM.Open, PlatformCAs: []*x509.Certificate{ca.Cert},
				DialNet: serve(t, cp, self, svc),
				Cmdline: func() ([]byte, error) { return []byte(cmdline), nil },
			})
			if err != nil {
				t.Fatal(err)
			}
			err = d.Call(context.Background(), "10.42.1.100:30090", func(ctx context.Context, c joinpb.JoinServiceClient, opt grpc.CallOption) error {
				_, err := c.IssueJoinTicket(ctx, &joinpb.IssueJoinTicketRequest{}, opt, grpc.WaitForReady(false))
				return err
			})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Call: %v", err)
				}
				if svc.calls.Load() != 1 {
					t.Fatalf("the service got %d requests, want 1", svc.calls.Load())
				}
				return
			}
			var refused *joinconn.RefusedError
			if !errors.As(err, &refused) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Call = %v, want a *RefusedError naming %s", err, tc.wantErr)
			}
			if n := svc.calls.Load(); n != 0 {
				t.Errorf("the refused service got %d requests", n)
			}
		})
	}
}

func TestRefusedErrorNamesTheZeroPCRs(t *testing.T) {
	err := &joinconn.RefusedError{Addr: "10.42.1.100:30090", Err: errors.New("PCR 12 mismatch")}
	if want := fmt.Sprintf("PCRs %v zero", joinconn.ZeroPCRs); !strings.Contains(err.Error(), want) {
		t.Errorf("%v\ndoes not say %q", err, want)
	}
}

// Once the node knows its cluster, it holds the join service to PCR 15 of
// that very cluster: a genuine control plane of another cluster of the
// same image (which the host can run) is refused and asked nothing.
func TestOfClusterRefusesAnotherCluster(t *testing.T) {
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	self := qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-1")
	cp := qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-1").Lock(t, "cluster A")
	svc := &joinService{}
	d, err := joinconn.New(joinconn.Config{
		Issuer: self.Issuer, OpenTPM: self.TPM.Open, PlatformCAs: []*x509.Certificate{ca.Cert},
		DialNet: serve(t, cp, self, svc),
		Cmdline: func() ([]byte, error) { return []byte("console=ttyS0"), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.OfCluster(nil); err == nil {
		t.Fatal("OfCluster without a cluster ID succeeded")
	}
	ask := func(d *joinconn.Dialer) error {
		return d.Call(context.Background(), "10.42.1.100:30090", func(ctx context.Context, c joinpb.JoinServiceClient, opt grpc.CallOption) error {
			_, err := c.IssueJoinTicket(ctx, &joinpb.IssueJoinTicketRequest{}, opt, grpc.WaitForReady(false))
			return err
		})
	}
	other, err := d.OfCluster([]byte("cluster B"))
	if err != nil {
		t.Fatal(err)
	}
	err = ask(other)
	var refused *joinconn.RefusedError
	if !errors.As(err, &refused) || !refused.OwnCluster || !strings.Contains(err.Error(), "PCR 15") || !strings.Contains(err.Error(), "locked to this node's own cluster") {
		t.Fatalf("another cluster's join service: err = %v, want a *RefusedError naming PCR 15 and this node's cluster", err)
	}
	if n := svc.calls.Load(); n != 0 {
		t.Fatalf("the other cluster's join service got %d requests", n)
	}
	own, err := d.OfCluster([]byte("cluster A"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []*joinconn.Dialer{own, d} {
		if err := ask(d); err != nil {
			t.Fatalf("the node's own cluster's join service: %v", err)
		}
	}
	if n := svc.calls.Load(); n != 2 {
		t.Fatalf("the join service got %d requests, want 2", n)
	}
}

// A join service whose attestation takes longer than gRPC's own connect
// deadline (20 s) still answers within the call's bound.
func TestCallWaitsForASlowJoinService(t *testing.T) {
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	self := qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-1")
	cp := qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-1").Lock(t, "cluster A")
	svc := &joinService{}
	d, err := joinconn.New(joinconn.Config{
		Issuer: self.Issuer, OpenTPM: self.TPM.Open, PlatformCAs: []*x509.Certificate{ca.Cert},
		DialNet: serveAs(t, atlstest.SlowIssuer{Issuer: cp.Issuer, Delay: 22 * time.Second}, attestsAs(t, self), svc),
		Cmdline: func() ([]byte, error) { return []byte("console=ttyS0"), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := askTicket(d); err != nil || svc.calls.Load() != 1 {
		t.Fatalf("after %v: %v, %d requests served; want the service's answer", time.Since(start).Round(time.Second), err, svc.calls.Load())
	}
}
