package nodeattest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	test "github.com/google/go-sev-guest/testing"
	attestpb "github.com/google/go-tpm-tools/proto/attest"

	"github.com/orrery-dev/orrery/internal/attestation/snp/snpsim"
	"github.com/orrery-dev/orrery/internal/attestation/tdx"
	"github.com/orrery-dev/orrery/internal/attestation/tdx/tdxtest"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/metadata"
)

type fakeMeta struct {
	self metadata.Instance
	err  error
	chip *snpsim.Chip
}

func (f fakeMeta) Self(context.Context) (metadata.Instance, error) { return f.self, f.err }
func (f fakeMeta) SEVSNPReport(_ context.Context, d [64]byte) ([]byte, error) {
	var g snpsim.Guest
	g.Measurement[0] = 0x42
	g.Policy = abi.SnpPolicy{SMT: true}
	return f.chip.ExtendedReport(g, d)
}

// kernelSays points Detect's view of the kernel at files that say what
// flags shows in /proc/cpuinfo, whether the SEV-SNP sysfs directory is
// there, and what the kernel command line is.
func kernelSays(t *testing.T, flags string, sevDir bool, cmdline string) {
	t.Helper()
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	old := []string{cpuInfo, kernelCmdline, sevSysfsDir, sevGuestDevice, tdxGuestDevice}
	t.Cleanup(func() {
		cpuInfo, kernelCmdline, sevSysfsDir, sevGuestDevice, tdxGuestDevice = old[0], old[1], old[2], old[3], old[4]
	})
	cpuInfo = write("cpuinfo", "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: "+flags+"\n\nprocessor\t: 1\nflags\t\t: fpu\n")
	kernelCmdline = write("cmdline", cmdline+"\n")
	sevSysfsDir = filepath.Join(dir, "sev")
	if sevDir {
		if err := os.Mkdir(sevSysfsDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sevGuestDevice, tdxGuestDevice = filepath.Join(dir, "sev-guest"), filepath.Join(dir, "tdx_guest")
}

const (
	plainFlags   = "fpu vme de pse tsc msr pae hypervisor"
	localCmdline = "console=ttyS0 orrery.roothash=ab orrery.flavour=local"
	cloudCmdline = "console=ttyS0 orrery.roothash=ab"
)

// testChip is a simulated SEV-SNP chip under go-sev-guest's test keys.
func testChip(t *testing.T) *snpsim.Chip {
	t.Helper()
	chip, err := snpsim.NewChip(snpsim.Config{Keys: test.DefaultAmdKeys(), Now: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return chip
}

func TestDetect(t *testing.T) {
	kernelSays(t, plainFlags, false, localCmdline)
	chip := testChip(t)
	ctx := context.Background()
	simulated := fakeMeta{self: metadata.Instance{Name: "cp-0", TEE: metadata.TEESimulatedSEVSNP}, chip: chip}
	p, err := Detect(ctx, simulated)
	if err != nil || p.Variant != variant.GCPSEVSNP || !p.Simulated {
		t.Fatalf("a simulated SEV-SNP VM: %+v %v", p, err)
	}
	peer, err := p.PeerPolicy()
	if err != nil {
		t.Fatal(err)
	}
	if peer.Variant != variant.GCPSEVSNP || peer.SEVSNP.Measurement.Expected[0] != 0x42 || peer.SEVSNP.TestRoot == nil || !peer.SEVSNP.TestRoot.NotARealCPU {
		t.Fatalf("the peer policy of a simulated VM: %+v", peer)
	}

	if p, err := Detect(ctx, fakeMeta{self: metadata.Instance{Name: "cp-0"}}); err != nil || p.Variant != variant.QEMUVTPM {
		t.Fatalf("a plain VM: %+v %v", p, err)
	}
	if p, err := Detect(ctx, nil); err != nil || p.Variant != variant.QEMUVTPM {
		t.Fatalf("no metadata service: %+v %v", p, err)
	}
	if _, err := Detect(ctx, fakeMeta{err: errors.New("no route")}); err == nil {
		t.Fatal("a metadata failure was taken for a plain VM: an SEV-SNP VM would attest as the wrong variant")
	}
	if _, err := (Platform{Variant: variant.QEMUVTPM}).peerSEVSNP(); err == nil {
		t.Fatal("a vTPM node made an SEV-SNP peer policy")
	}
}

// countingMeta is fakeMeta that counts the questions it is asked.
type countingMeta struct {
	fakeMeta
	asked *int
}

func (c countingMeta) Self(ctx context.Context) (metadata.Instance, error) {
	*c.asked++
	return c.fakeMeta.Self(ctx)
}

// Where the kernel runs as a confidential guest, or the image is the
// cloud flavour, the metadata's word that the VM is a simulated SEV-SNP
// VM is refused, and asking again does not change that.
func TestDetectRefusesTheSimulationOnHardwareAndCloudImages(t *testing.T) {
	chip := testChip(t)
	simulated := fakeMeta{self: metadata.Instance{Name: "cp-0", TEE: metadata.TEESimulatedSEVSNP}, chip: chip}
	tests := map[string]struct {
		flags, cmdline string
		sevDir         bool
		want           []string
		// metaAsked: the metadata service is asked at all.
		metaAsked bool
	}{
		"SEV-SNP guest (sysfs), no sev-guest device": {flags: plainFlags, sevDir: true, cmdline: localCmdline,
			want: []string{"SEV-SNP guest", "sev-guest driver did not start", "/sev exists"}},
		"SEV-SNP CPU flag, no sev-guest device": {flags: plainFlags + " sev sev_es sev_snp", cmdline: localCmdline,
			want: []string{"SEV-SNP guest", "shows sev_snp"}},
		"TDX guest, no tdx_guest device": {flags: plainFlags + " tdx_guest", cmdline: localCmdline,
			want: []string{"TDX guest", "tdx-guest driver did not start", "shows tdx_guest"}},
		"cloud image told it is simulated": {flags: plainFlags, cmdline: cloudCmdline, metaAsked: true,
			want: []string{"cloud flavour", "trusts no test root", "local flavour"}},
		"a flavour argument that only looks local": {flags: plainFlags, cmdline: cloudCmdline + " orrery.flavour=localx", metaAsked: true,
			want: []string{"cloud flavour"}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			kernelSays(t, tt.flags, tt.sevDir, tt.cmdline)
			asked := 0
			meta := countingMeta{simulated, &asked}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p, err := DetectUntil(ctx, meta, func(int, error) {})
			var refused *RefusedError
			if !errors.As(err, &refused) {
				t.Fatalf("got %+v, %v; want a refusal", p, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if (asked > 0) != tt.metaAsked || asked > 1 {
				t.Errorf("the metadata service was asked %d times; want %v, and never again after a refusal", asked, tt.metaAsked)
			}
		})
	}
}

// The hardware's own device wins over everything the metadata says; and
// a cloud image on a plain VM attests with its vTPM.
func TestDetectHardwareAndPlainVMs(t *testing.T) {
	ctx := context.Background()
	simulated := fakeMeta{self: metadata.Instance{Name: "cp-0", TEE: metadata.TEESimulatedSEVSNP}}
	kernelSays(t, plainFlags+" sev_snp", true, cloudCmdline)
	if err := os.WriteFile(sevGuestDevice, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if p, err := Detect(ctx, simulated); err != nil || p.Variant != variant.GCPSEVSNP || p.Simulated {
		t.Fatalf("an SEV-SNP guest with its device: %+v %v", p, err)
	}
	kernelSays(t, plainFlags+" tdx_guest", false, cloudCmdline)
	if err := os.WriteFile(tdxGuestDevice, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if p, err := Detect(ctx, simulated); err != nil || p.Variant != variant.GCPTDX {
		t.Fatalf("a TDX guest with its device: %+v %v", p, err)
	}
	kernelSays(t, plainFlags, false, cloudCmdline)
	if p, err := Detect(ctx, fakeMeta{self: metadata.Instance{Name: "w-0"}}); err != nil || p.Variant != variant.QEMUVTPM {
		t.Fatalf("a cloud image on a plain VM: %+v %v", p, err)
	}
}

// A kernel view that cannot be read is an error, never "no hardware".
func TestDetectUnreadableKernelView(t *testing.T) {
	kernelSays(t, plainFlags, false, localCmdline)
	cpuInfo = filepath.Join(t.TempDir(), "absent")
	if p, err := Detect(context.Background(), nil); err == nil {
		t.Fatalf("no /proc/cpuinfo taken for a plain VM: %+v", p)
	}
	kernelSays(t, plainFlags, false, localCmdline)
	if err := os.WriteFile(cpuInfo, []byte("processor\t: 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Detect(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "no flags line") {
		t.Fatalf("a cpuinfo without flags: %v", err)
	}
}

// tdxNode is a TDX platform whose TD report comes from td, and whose
// peers' quotes are checked under td's test PKI.
func tdxNode(td *tdxtest.TD) Platform {
	return Platform{Variant: variant.GCPTDX, tdReport: td.Report, tdxRoots: td.PKI.Roots()}
}

// attestationOf is what a gcp-tdx peer running td sends of its TD quote
// for reportData.
func attestationOf(t *testing.T, td *tdxtest.TD, reportData []byte) *attestpb.Attestation {
	t.Helper()
	raw, err := td.GetRawQuote([64]byte(reportData))
	if err != nil {
		t.Fatal(err)
	}
	q, err := tdx.ParseQuote(raw)
	if err != nil {
		t.Fatal(err)
	}
	return &attestpb.Attestation{TeeAttestation: &attestpb.Attestation_TdxAttestation{TdxAttestation: q}}
}

// A TDX node holds its peer to its own MRTD and boot chain (RTMR1, RTMR2),
// read from its own TD report, and to Intel's root.
func TestTDXPeerPolicy(t *testing.T) {
	pki := tdxtest.NewPKI(t, time.Now())
	self := tdxtest.NewTD(t, pki)
	peer, err := tdxNode(self).PeerPolicy()
	if err != nil {
		t.Fatal(err)
	}
	if peer.Variant != variant.GCPTDX || peer.TDX == nil || peer.SEVSNP != nil || !peer.ImageBound() {
		t.Fatalf("the peer policy of a TDX node: %+v", peer)
	}
	if !bytes.Equal(peer.TDX.MRTD.Expected, self.MRTD) || !bytes.Equal(peer.TDX.RTMR[1].Expected, self.RTMR[1]) ||
		!bytes.Equal(peer.TDX.RTMR[2].Expected, self.RTMR[2]) || peer.TDX.RTMR[0] != nil || peer.TDX.RTMR[3] != nil {
		t.Fatalf("the peer policy does not hold this node's MRTD, RTMR1 and RTMR2 alone: %+v", peer.TDX)
	}

	reportData := tee.ReportData([]byte("nonce"), []byte("tls key"))
	for name, tc := range map[string]struct {
		change  func(td *tdxtest.TD, p *PeerPolicy)
		wantErr string
	}{
		"a peer of the same image":                {},
		"a peer of another machine shape":         {change: func(td *tdxtest.TD, _ *PeerPolicy) { td.RTMR[0] = bytes.Repeat([]byte{1}, 48) }},
		"a peer of other firmware":                {change: func(td *tdxtest.TD, _ *PeerPolicy) { td.MRTD = bytes.Repeat([]byte{1}, 48) }, wantErr: "mrtd is 0101"},
		"a peer of another boot chain":            {change: func(td *tdxtest.TD, _ *PeerPolicy) { td.RTMR[1] = bytes.Repeat([]byte{1}, 48) }, wantErr: "rtmr1 is 0101"},
		"a peer under a root that is not Intel's": {change: func(_ *tdxtest.TD, p *PeerPolicy) { p.TDXRoots = nil }, wantErr: "does not end in a trusted root"},
	} {
		t.Run(name, func(t *testing.T) {
			other := *self
			p := peer
			if tc.change != nil {
				tc.change(&other, &p)
			}
			v, err := p.TEEVerifier()
			if err != nil {
				t.Fatal(err)
			}
			_, err = v.VerifyTEE(context.Background(), attestationOf(t, &other, reportData), reportData)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("VerifyTEE() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestTDXPeerPolicyNeedsATDReport(t *testing.T) {
	for name, report := range map[string]func([64]byte) ([]byte, error){
		"no device":        func([64]byte) ([]byte, error) { return nil, errors.New("no /dev/tdx_guest") },
		"too short":        func([64]byte) ([]byte, error) { return make([]byte, 512), nil },
		"not a TDX report": func([64]byte) ([]byte, error) { return make([]byte, 1024), nil },
	} {
		t.Run(name, func(t *testing.T) {
			if p, err := (Platform{Variant: variant.GCPTDX, tdReport: report}).PeerPolicy(); err == nil {
				t.Fatalf("a TDX node made a peer policy without its own TD report: %+v", p)
			}
		})
	}
	if _, err := (Platform{Variant: variant.GCPSEVSNP}).OwnTD(); err == nil {
		t.Fatal("an SEV-SNP node read a TD report")
	}
}

// A vTPM node holds its peer to nothing but the vTPM, and only a vTPM
// node does.
func TestQEMUPeerPolicy(t *testing.T) {
	peer, err := (Platform{Variant: variant.QEMUVTPM}).PeerPolicy()
	if err != nil || peer.Variant != variant.QEMUVTPM || peer.ImageBound() || peer.Describe() != "" {
		t.Fatalf("the peer policy of a vTPM node: %+v %v", peer, err)
	}
	if v, err := peer.TEEVerifier(); v != nil || err != nil {
		t.Fatalf("a vTPM node's peer has a hardware verifier: %v %v", v, err)
	}
	for _, p := range []PeerPolicy{{Variant: variant.GCPSEVSNP}, {Variant: variant.GCPTDX}, {}} {
		if _, err := p.TEEVerifier(); err == nil {
			t.Errorf("a %q peer policy without its hardware's policy made a verifier", p.Variant)
		}
	}
}
