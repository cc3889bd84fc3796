package joinclient

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/joinconn"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/role"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm/swtpmtest"
)

// imageOf is the TrustParam value naming n's image (its PCRs 4, 9, 11).
func imageOf(t *testing.T, n *qemutest.Node) string {
	t.Helper()
	rw := swtpmtest.Open(t, n.TPM)
	defer rw.Close()
	pcrs, err := client.ReadPCRs(rw, tpm2.PCRSelection{Hash: tpm2.AlgSHA256, PCRs: []int{4, 9, 11}})
	if err != nil {
		t.Fatal(err)
	}
	m := measurements.M{}
	for pcr, v := range pcrs.GetPcrs() {
		m[pcr] = measurements.Measurement{Expected: v}
	}
	v, err := joinconn.TrustValue(m)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// A node of a new image joins through the control plane of the image it
// replaces only if its kernel command line (measured with its UKI) names
// that image; a malformed name stops it rather than trusting anyone.
func TestNewImageTrustsTheOldImagesJoinService(t *testing.T) {
	p := newPlatform(t)
	cp := p.controlPlane(t, "image-1")
	self := p.node(t, "image-1", "image-2") // a new UKI: PCR 11 differs
	svc := &joinService{resp: ticket()}
	addr := genuineService(t, cp, self, svc)
	config := func(cmdline string) Config {
		cfg := nodeConfig(t, self, role.Worker, []metadata.Instance{cp0})
		cfg.dialNet = route(map[netip.Addr]string{cp0.IP: addr})
		cfg.cmdline = func() ([]byte, error) { return []byte(cmdline), nil }
		return cfg
	}

	// Without the parameter: refused, as any other image's service.
	cfg := config("console=ttyS0 orrery.roothash=ab")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := Run(ctx, cfg); err == nil {
		t.Fatal("the node joined through another image's join service")
	}
	if _, calls := svc.requests(); calls != 0 {
		t.Fatalf("the service of another image got %d requests", calls)
	}

	// Naming the old image: joins.
	cfg = config("console=ttyS0 " + joinconn.TrustParam + "=" + imageOf(t, cp) + " orrery.roothash=ab")
	if err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if d := cfg.Disk.(*disk); !bytes.Equal(d.key, ticket().StateDiskKey) {
		t.Fatal("the disk was not re-keyed with the ticket's key")
	}

	for _, bad := range []string{joinconn.TrustParam + "=abc", joinconn.TrustParam + "=" + strings.Repeat("zz", 32) + ",a,b"} {
		if err := Run(context.Background(), config(bad)); err == nil || !strings.Contains(err.Error(), joinconn.TrustParam) {
			t.Errorf("%s: err = %v, want the parameter named", bad, err)
		}
	}
}
