package nodeattest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	test "github.com/google/go-sev-guest/testing"

	"github.com/orrery-dev/orrery/internal/attestation/snp/snpsim"
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

func TestDetect(t *testing.T) {
	chip, err := snpsim.NewChip(snpsim.Config{Keys: test.DefaultAmdKeys(), Now: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	simulated := fakeMeta{self: metadata.Instance{Name: "cp-0", TEE: metadata.TEESimulatedSEVSNP}, chip: chip}
	p, err := Detect(ctx, simulated)
	if err != nil || p.Variant != variant.GCPSEVSNP || !p.Simulated {
		t.Fatalf("a simulated SEV-SNP VM: %+v %v", p, err)
	}
	peer, err := p.PeerSEVSNP()
	if err != nil {
		t.Fatal(err)
	}
	if peer.Measurement.Expected[0] != 0x42 || peer.TestRoot == nil || !peer.TestRoot.NotARealCPU {
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
	if _, err := (Platform{Variant: variant.QEMUVTPM}).PeerSEVSNP(); err == nil {
		t.Fatal("a vTPM node made an SEV-SNP peer policy")
	}
}
