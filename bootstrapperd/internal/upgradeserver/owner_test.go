package upgradeserver

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/atls/atlstest"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/owner/inspect"
	"github.com/orrery-dev/orrery/internal/owner/kubeupgrade"
	"github.com/orrery-dev/orrery/internal/owneraccess"
	"github.com/orrery-dev/orrery/internal/proto/kubeupgradepb"
)

// TestOnlyTheOwnerUpgrades serves the upgrade service as a node does, over
// attested TLS from a node whose vTPM (swtpm) is locked to the owner's
// cluster, and asks with the owner's key and with another.
func TestOnlyTheOwnerUpgrades(t *testing.T) {
	oldest, newest := releases(t)
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	n := qemutest.NewNode(t).Boot(t, "image", "image").Lock(t, "cluster-a")
	f := newFixture(t, oldest, "")
	owner := func() (ed25519.PublicKey, error) { return pub, nil }
	addr := atlstest.Serve(t, atls.Config{Issuer: n.Issuer, AuthorizeClient: owneraccess.Authorize(owner)},
		func(s *grpc.Server) { kubeupgradepb.RegisterKubernetesUpgradeServiceServer(s, New(f.cfg)) })
	m := measurements.M{}
	for pcr, v := range n.PCRs(t) {
		if pcr == 4 || pcr == 9 || pcr == 11 {
			m[pcr] = measurements.Measurement{Expected: v}
		}
	}
	own := inspect.Owner{Key: key, ClusterID: []byte("cluster-a"), Images: []inspect.Image{{Name: "image.json", Policy: policy.Policy{PCRs: m}}},
		PlatformCAs: []*x509.Certificate{n.CA.Cert}}

	stranger := own
	_, stranger.Key, _ = ed25519.GenerateKey(rand.Reader)
	if _, err := kubeupgrade.Dial(t.Context(), stranger, addr, ""); err == nil || !strings.Contains(err.Error(), "answers only its owner") {
		t.Errorf("a caller with another key: %v, want the node's refusal", err)
	}
	otherCluster := own
	otherCluster.ClusterID = []byte("cluster-b")
	if _, err := kubeupgrade.Dial(t.Context(), otherCluster, addr, ""); err == nil || !strings.Contains(err.Error(), "PCR 15") {
		t.Errorf("the owner of another cluster: %v, want a refusal naming PCR 15", err)
	}
	if ran := f.runner.ran(); len(ran) != 0 {
		t.Fatalf("refused callers ran %q", ran)
	}

	r, err := kubeupgrade.Dial(t.Context(), own, addr, "")
	if err != nil {
		t.Fatalf("the owner was refused: %v", err)
	}
	defer r.Close()
	if r.Releases.Running != oldest || len(r.Releases.Carried) < 2 {
		t.Errorf("the node says it runs %s and carries %v", r.Releases.Running, r.Releases.Carried)
	}
	var lines []string
	if err := r.Upgrade(t.Context(), newest, false, func(l string) { lines = append(lines, l) }); err != nil {
		t.Fatalf("the owner's upgrade: %v\n%s", err, strings.Join(lines, "\n"))
	}
	if got, _ := f.node.Active(); got != newest {
		t.Errorf("the node runs %s after the owner's upgrade, want %s", got, newest)
	}
	if err := r.Upgrade(t.Context(), oldest, false, func(string) {}); err == nil || !strings.Contains(err.Error(), "downgraded") {
		t.Errorf("the owner's downgrade: %v, want the node's refusal", err)
	}
}
