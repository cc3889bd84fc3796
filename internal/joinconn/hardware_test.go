package joinconn_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	snptest "github.com/google/go-sev-guest/testing"
	"github.com/google/go-tpm-tools/client"
	attestpb "github.com/google/go-tpm-tools/proto/attest"
	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/atls/atlstest"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/gcp"
	"github.com/orrery-dev/orrery/internal/attestation/nodeattest"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/attestation/snp"
	"github.com/orrery-dev/orrery/internal/attestation/snp/snpsim"
	"github.com/orrery-dev/orrery/internal/attestation/tdx"
	"github.com/orrery-dev/orrery/internal/attestation/tdx/tdxtest"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/joinconn"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/testkit/syncbuffer"
)

// tdxNode is a TDX confidential VM without the VM: a vTPM provisioned as
// the platform provisions it (GCE's AK indexes), and a TD on a test TDX
// platform whose quotes it attaches, as a gcp-tdx node does.
type tdxNode struct {
	*qemutest.Node
	TD *tdxtest.TD
	// quotes is the TD's quote provider; nil is the TD itself.
	quotes interface {
		IsSupported() error
		GetRawQuote([64]byte) ([]byte, error)
	}
}

func newTDXNode(t *testing.T, ca *platformca.CA, pki *tdxtest.PKI) *tdxNode {
	t.Helper()
	return &tdxNode{Node: qemutest.NewNodeOf(t, ca), TD: tdxtest.NewTD(t, pki)}
}

// issuer is the node's gcp-tdx issuer.
func (n *tdxNode) issuer(t *testing.T) attestation.Issuer {
	t.Helper()
	iss, err := gcp.NewTDXIssuer(gcp.IssuerConfig{
		OpenTPM: n.TPM.Open, MeasurementLog: n.Log,
		OpenTEE: func() (client.TEEDevice, error) {
			if n.quotes != nil {
				return &client.TdxQuoteProvider{QuoteProvider: n.quotes}, nil
			}
			return &client.TdxQuoteProvider{QuoteProvider: n.TD}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

// peer is what the node holds its join service to, as
// nodeattest.Platform.PeerPolicy makes it from the node's own TD report,
// with the test platform's root in place of Intel's.
func (n *tdxNode) peer() nodeattest.PeerPolicy {
	pol := tdx.PeerPolicy(tdx.Measurements{MRTD: n.TD.MRTD, RTMR: n.TD.RTMR})
	return nodeattest.PeerPolicy{Variant: variant.GCPTDX, TDX: &pol, TDXRoots: n.TD.PKI.Roots()}
}

// validator is the join service's check of this node as a joining node:
// its PCRs and a TD quote of its MRTD under the test platform.
func (n *tdxNode) validator(t *testing.T) attestation.Validator {
	t.Helper()
	tv, err := tdx.NewVerifier(tdx.Config{
		Policy:         tdx.Policy{MRTD: &tee.Expected{Expected: n.TD.MRTD}},
		SkipCollateral: true, TrustedRoots: n.TD.PKI.Roots(), Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	v, err := gcp.NewTDXValidator(gcp.ValidatorConfig{
		Measurements: pcrsOf(t, n.Node, joinconn.ImagePCRs...), AKRoots: []*x509.Certificate{n.CA.Cert},
		AKInstance: platformca.InstanceOf, TEE: tv,
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// serveAs runs svc as a join service that attests with issuer and admits
// a joining node that nodeCheck accepts, and returns a DialNet that sends
// every address to it.
func serveAs(t *testing.T, issuer attestation.Issuer, nodeCheck attestation.Validator, svc *joinService) func(context.Context, string) (net.Conn, error) {
	t.Helper()
	addr := atlstest.Serve(t, atls.Config{Issuer: issuer, Validators: []attestation.Validator{nodeCheck}},
		func(srv *grpc.Server) { joinpb.RegisterJoinServiceServer(srv, svc) })
	return func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
}

func askTicket(d *joinconn.Dialer) error {
	return d.Call(context.Background(), "10.42.1.100:30090", func(ctx context.Context, c joinpb.JoinServiceClient, opt grpc.CallOption) error {
		_, err := c.IssueJoinTicket(ctx, &joinpb.IssueJoinTicketRequest{}, opt, grpc.WaitForReady(false))
		return err
	})
}

// checkCall asks d for a join ticket. With no wantErr, the service must
// get the request. Otherwise the call must be refused with an error that
// names wantErr and says what the service's hardware evidence had to
// show, and the service must get nothing.
func checkCall(t *testing.T, d *joinconn.Dialer, svc *joinService, wantErr, hardware string) {
	t.Helper()
	err := askTicket(d)
	if wantErr == "" {
		if err != nil {
			t.Fatalf("Call: %v", err)
		}
		if n := svc.calls.Load(); n != 1 {
			t.Fatalf("the service got %d requests, want 1", n)
		}
		return
	}
	t.Log(err)
	var refused *joinconn.RefusedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), wantErr) {
		t.Fatalf("Call = %v, want a *RefusedError naming %q", err, wantErr)
	}
	if !strings.Contains(err.Error(), hardware) {
		t.Errorf("%v\ndoes not say what the hardware evidence had to show (%s)", err, hardware)
	}
	if n := svc.calls.Load(); n != 0 {
		t.Errorf("the refused service got %d requests", n)
	}
}

// noQuote is a TEE device that attaches nothing: an attestation of a
// hardware variant with a vTPM quote alone.
type noQuote struct{}

func (noQuote) AddAttestation(*attestpb.Attestation, client.AttestOpts) error { return nil }
func (noQuote) Close() error                                                  { return nil }

// relayed asks the TD for a quote over other report data than the
// session's, as a relay of another session's quote would show.
type relayed struct{ *tdxtest.TD }

func (r relayed) GetRawQuote(d [64]byte) ([]byte, error) {
	d[0] ^= 1
	return r.TD.GetRawQuote(d)
}

// tdxJoinServiceCases are the control planes a TDX node meets, as the
// issuer each one attests with.
var tdxJoinServiceCases = map[string]struct {
	// service makes the control plane's issuer; cp runs the image
	// the node runs, locked to a cluster.
	service func(t *testing.T, cp *tdxNode) attestation.Issuer
	wantErr string
}{
	"gcp-tdx: the node's own MRTD and boot chain": {
		service: func(t *testing.T, cp *tdxNode) attestation.Issuer { return cp.issuer(t) },
	},
	"gcp-tdx: another machine shape (RTMR0) and run-time events (RTMR3)": {
		service: func(t *testing.T, cp *tdxNode) attestation.Issuer {
			cp.TD.RTMR[0], cp.TD.RTMR[3] = bytes.Repeat([]byte{1}, 48), bytes.Repeat([]byte{2}, 48)
			return cp.issuer(t)
		},
	},
	"qemu-vtpm: AK under the node's platform CA and PCRs equal": {
		service: func(_ *testing.T, cp *tdxNode) attestation.Issuer { return cp.Issuer },
		wantErr: "attested as qemu-vtpm, which this side does not accept",
	},
	"gcp-tdx without a TD quote": {
		service: func(t *testing.T, cp *tdxNode) attestation.Issuer {
			iss, err := gcp.NewTDXIssuer(gcp.IssuerConfig{OpenTPM: cp.TPM.Open, MeasurementLog: cp.Log,
				OpenTEE: func() (client.TEEDevice, error) { return noQuote{}, nil }})
			if err != nil {
				t.Fatal(err)
			}
			return iss
		},
		wantErr: "carries no TDX quote",
	},
	"gcp-tdx: other firmware (MRTD)": {
		service: func(t *testing.T, cp *tdxNode) attestation.Issuer {
			cp.TD.MRTD = bytes.Repeat([]byte{0xab}, 48)
			return cp.issuer(t)
		},
		wantErr: "mrtd is abab",
	},
	"gcp-tdx: another boot loader (RTMR1)": {
		service: func(t *testing.T, cp *tdxNode) attestation.Issuer {
			cp.TD.RTMR[1] = bytes.Repeat([]byte{0xab}, 48)
			return cp.issuer(t)
		},
		wantErr: "rtmr1 is abab",
	},
	"gcp-tdx: a debug TD": {
		service: func(t *testing.T, cp *tdxNode) attestation.Issuer {
			cp.TD.TDAttributes[0] |= 1
			return cp.issuer(t)
		},
		wantErr: "tdAttributes.DEBUG",
	},
	"gcp-tdx: a quote of another session": {
		service: func(t *testing.T, cp *tdxNode) attestation.Issuer {
			cp.quotes = relayed{cp.TD}
			return cp.issuer(t)
		},
		wantErr: "REPORT_DATA does not bind this session",
	},
	"gcp-tdx: a platform under another root": {
		service: func(t *testing.T, cp *tdxNode) attestation.Issuer {
			td := *cp.TD
			td.PKI = tdxtest.NewPKI(t, time.Now())
			cp.TD = &td
			return cp.issuer(t)
		},
		wantErr: "does not end in a trusted root",
	},
	"gcp-tdx: a command line from the boot loader in PCR 12": {
		service: func(t *testing.T, cp *tdxNode) attestation.Issuer {
			extendUnlogged(t, cp.Node, 12, "orrery.roothash=0123")
			return cp.issuer(t)
		},
		wantErr: "PCR 12",
	},
}

// A TDX node holds its join service to a TD quote of its own firmware
// and boot chain: the host controls the vTPM and the platform CA the node
// trusts, so a vTPM that shows the right PCRs under that CA proves
// nothing on its own. A refused service gets no request.
func TestTDXNodeHoldsItsJoinServiceToATDQuote(t *testing.T) {
	for name, tc := range tdxJoinServiceCases {
		t.Run(name, func(t *testing.T) {
			ca, err := platformca.New("test platform CA")
			if err != nil {
				t.Fatal(err)
			}
			pki := tdxtest.NewPKI(t, time.Now())
			self := newTDXNode(t, ca, pki)
			self.Boot(t, "image-1", "image-1")
			cp := newTDXNode(t, ca, pki)
			cp.Boot(t, "image-1", "image-1")
			cp.Lock(t, "cluster ID")
			svc := &joinService{}
			d, err := joinconn.New(joinconn.Config{
				Issuer: self.issuer(t), OpenTPM: self.TPM.Open, PlatformCAs: []*x509.Certificate{ca.Cert},
				Peer:    self.peer(),
				DialNet: serveAs(t, tc.service(t, cp), self.validator(t), svc),
				Cmdline: func() ([]byte, error) { return []byte("console=ttyS0"), nil },
			})
			if err != nil {
				t.Fatal(err)
			}
			checkCall(t, d, svc, tc.wantErr, "a TD quote chained to Intel's root")
		})
	}
}

// A node holds its join service to the evidence of the kind it attests
// with itself: a dialer whose peer policy is of another variant than its
// issuer's is not made, so a TDX node cannot end up accepting a vTPM
// alone.
func TestPeerPolicyMustBeTheNodesOwnKind(t *testing.T) {
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	self := newTDXNode(t, ca, tdxtest.NewPKI(t, time.Now()))
	qemuPeer, err := (nodeattest.Platform{Variant: variant.QEMUVTPM}).PeerPolicy()
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		issuer  attestation.Issuer
		peer    nodeattest.PeerPolicy
		wantErr string
	}{
		"a TDX node without a peer policy":    {issuer: self.issuer(t), wantErr: "attests as gcp-tdx, but would hold its join service to qemu-vtpm"},
		"a TDX node with a vTPM peer policy":  {issuer: self.issuer(t), peer: qemuPeer, wantErr: "attests as gcp-tdx, but would hold its join service to qemu-vtpm"},
		"a TDX node without a TDX policy":     {issuer: self.issuer(t), peer: nodeattest.PeerPolicy{Variant: variant.GCPTDX}, wantErr: "no TDX policy"},
		"a vTPM node with a TDX peer policy":  {issuer: self.Issuer, peer: self.peer(), wantErr: "attests as qemu-vtpm, but would hold its join service to gcp-tdx"},
		"an SEV-SNP policy for a TDX node":    {issuer: self.issuer(t), peer: nodeattest.PeerPolicy{Variant: variant.GCPSEVSNP}, wantErr: "attests as gcp-tdx"},
		"a TDX node with its own peer policy": {issuer: self.issuer(t), peer: self.peer()},
		"a vTPM node without a peer policy":   {issuer: self.Issuer},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := joinconn.New(joinconn.Config{
				Issuer: tc.issuer, OpenTPM: self.TPM.Open, PlatformCAs: []*x509.Certificate{ca.Cert}, Peer: tc.peer,
				Cmdline: func() ([]byte, error) { return nil, nil },
			})
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("New() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// A TDX node's hardware evidence names its image (RTMR1 holds its UKI),
// and the kernel command line names a further image by its PCRs only: a
// TDX node trusts the join services of its own image alone, and says so.
func TestTDXNodeTrustsNoFurtherImage(t *testing.T) {
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	pki := tdxtest.NewPKI(t, time.Now())
	self := newTDXNode(t, ca, pki)
	self.Boot(t, "image-1", "image-1")
	cp := newTDXNode(t, ca, pki)
	cp.Boot(t, "image-0", "image-0")
	cp.Lock(t, "cluster ID")
	cp.TD.RTMR[1] = bytes.Repeat([]byte{0xab}, 48) // image-0's UKI
	trust, err := joinconn.TrustValue(pcrsOf(t, cp.Node, joinconn.ImagePCRs...))
	if err != nil {
		t.Fatal(err)
	}
	var log syncbuffer.Buffer
	svc := &joinService{}
	d, err := joinconn.New(joinconn.Config{
		Issuer: self.issuer(t), OpenTPM: self.TPM.Open, PlatformCAs: []*x509.Certificate{ca.Cert},
		Peer:    self.peer(),
		Logger:  slog.New(slog.NewTextHandler(&log, nil)),
		DialNet: serveAs(t, cp.issuer(t), self.validator(t), svc),
		Cmdline: func() ([]byte, error) { return []byte(joinconn.TrustParam + "=" + trust), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "not trusting the join services of the further images") {
		t.Errorf("log %q does not say that the further image is not trusted", log.String())
	}
	var refused *joinconn.RefusedError
	if err := askTicket(d); !errors.As(err, &refused) {
		t.Fatalf("Call = %v, want a *RefusedError", err)
	}
	if n := svc.calls.Load(); n != 0 {
		t.Errorf("the refused service got %d requests", n)
	}
}

// snpNode is the local cloud's simulated SEV-SNP VM without the VM: a
// vTPM and a guest of a simulated AMD chip, whose reports it attaches.
type snpNode struct {
	*qemutest.Node
	chip  *snpsim.Chip
	guest snpsim.Guest
}

func newSNPNode(t *testing.T, ca *platformca.CA, chip *snpsim.Chip) *snpNode {
	t.Helper()
	n := &snpNode{Node: qemutest.NewNodeOf(t, ca), chip: chip}
	n.guest.Measurement[0] = 0x6f
	n.guest.Policy = abi.SnpPolicy{SMT: true}
	return n
}

func (n *snpNode) issuer(t *testing.T, tee func() (client.TEEDevice, error)) attestation.Issuer {
	t.Helper()
	if tee == nil {
		tee = func() (client.TEEDevice, error) {
			return &client.SevSnpQuoteProvider{QuoteProvider: snp.QuoteProvider{GetReport: func(d [64]byte) ([]byte, error) {
				return n.chip.ExtendedReport(n.guest, d)
			}}}, nil
		}
	}
	iss, err := gcp.NewSEVSNPIssuer(gcp.IssuerConfig{OpenTPM: n.TPM.Open, MeasurementLog: n.Log, OpenTEE: tee})
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

// peer is what nodeattest.Platform.PeerPolicy makes on the simulated
// platform: the node's own launch measurement, under the chip's test
// root.
func (n *snpNode) peer() nodeattest.PeerPolicy {
	root := n.chip.TestRoot()
	return nodeattest.PeerPolicy{Variant: variant.GCPSEVSNP, SEVSNP: &snp.Policy{
		Measurement: &tee.Expected{Expected: bytes.Clone(n.guest.Measurement[:])}, TestRoot: &root,
	}}
}

func (n *snpNode) validator(t *testing.T) attestation.Validator {
	t.Helper()
	tv, err := n.peer().TEEVerifier()
	if err != nil {
		t.Fatal(err)
	}
	v, err := gcp.NewSEVSNPValidator(gcp.ValidatorConfig{
		Measurements: pcrsOf(t, n.Node, joinconn.ImagePCRs...), AKRoots: []*x509.Certificate{n.CA.Cert},
		AKInstance: platformca.InstanceOf, TEE: tv,
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The same for an SEV-SNP node: its join service must show an SEV-SNP
// report of the node's own launch measurement; a vTPM alone is refused.
func TestSEVSNPNodeHoldsItsJoinServiceToAReport(t *testing.T) {
	chip, err := snpsim.NewChip(snpsim.Config{Keys: snptest.DefaultAmdKeys(), Now: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		service func(t *testing.T, cp *snpNode) attestation.Issuer
		wantErr string
	}{
		"gcp-sev-snp: the node's own launch measurement": {
			service: func(t *testing.T, cp *snpNode) attestation.Issuer { return cp.issuer(t, nil) },
		},
		"qemu-vtpm: AK under the node's platform CA and PCRs equal": {
			service: func(_ *testing.T, cp *snpNode) attestation.Issuer { return cp.Issuer },
			wantErr: "attested as qemu-vtpm, which this side does not accept",
		},
		"gcp-sev-snp without a report": {
			service: func(t *testing.T, cp *snpNode) attestation.Issuer {
				return cp.issuer(t, func() (client.TEEDevice, error) { return noQuote{}, nil })
			},
			wantErr: "carries no SEV-SNP report",
		},
		"gcp-sev-snp: other firmware": {
			service: func(t *testing.T, cp *snpNode) attestation.Issuer {
				cp.guest.Measurement[0] = 0x70
				return cp.issuer(t, nil)
			},
			wantErr: "measurement is 70",
		},
		"gcp-sev-snp: a debug guest": {
			service: func(t *testing.T, cp *snpNode) attestation.Issuer {
				cp.guest.Policy.Debug = true
				return cp.issuer(t, nil)
			},
			wantErr: "guest policy debug",
		},
	} {
		t.Run(name, func(t *testing.T) {
			ca, err := platformca.New("test platform CA")
			if err != nil {
				t.Fatal(err)
			}
			self := newSNPNode(t, ca, chip)
			self.Boot(t, "image-1", "image-1")
			cp := newSNPNode(t, ca, chip)
			cp.Boot(t, "image-1", "image-1")
			cp.Lock(t, "cluster ID")
			svc := &joinService{}
			d, err := joinconn.New(joinconn.Config{
				Issuer: self.issuer(t, nil), OpenTPM: self.TPM.Open, PlatformCAs: []*x509.Certificate{ca.Cert},
				Peer:    self.peer(),
				DialNet: serveAs(t, tc.service(t, cp), self.validator(t), svc),
				Cmdline: func() ([]byte, error) { return []byte("console=ttyS0"), nil },
			})
			if err != nil {
				t.Fatal(err)
			}
			checkCall(t, d, svc, tc.wantErr, "an SEV-SNP report with this node's launch measurement")
		})
	}
}
