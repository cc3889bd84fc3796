package owner

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"log/slog"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/attestation/validator"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/nodelock"
)

// Init records its first node as admitted for the VM that the node's AK
// certificate names. A retried init (the workspace already holds the
// master secret and the salt) checks the node with a validator that also
// accepts this cluster's node lock; it must name the VM too, or the
// cluster's first control plane cannot rejoin after a reboot.
func TestInitValidatorNamesTheNode(t *testing.T) {
	ms, err := keys.GenerateMasterSecret(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	salt, err := keys.GenerateSalt(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	msec, err := ms.MeasurementSecret()
	if err != nil {
		t.Fatal(err)
	}
	clusterID, err := keys.ClusterID(msec, salt)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)

	for name, tc := range map[string]struct {
		retry, locked bool
	}{
		"first init":            {},
		"retry before the lock": {retry: true},
		"retry after the lock":  {retry: true, locked: true},
	} {
		t.Run(name, func(t *testing.T) {
			n := qemutest.NewNode(t)
			if tc.locked {
				if took, err := nodelock.New(n.TPM.Open, n.Log).TryLock(clusterID); err != nil || !took {
					t.Fatalf("lock the node: %v, %v", took, err)
				}
			}
			v, err := initValidator(validator.Config{Policy: zeroMeasurements(), PlatformCAs: []*x509.Certificate{n.CA.Cert}, Logger: log}, ms, salt, tc.retry)
			if err != nil {
				t.Fatal(err)
			}
			nonce, userData := []byte("nonce of this test"), []byte("tls key")
			doc, err := n.Issuer.Issue(context.Background(), userData, nonce)
			if err != nil {
				t.Fatal(err)
			}
			p, err := v.ValidateProof(context.Background(), doc, nonce)
			if err != nil {
				t.Fatal(err)
			}
			got, inst := p.UserData, p.Instance
			if string(got) != string(userData) {
				t.Errorf("user data %q, want %q", got, userData)
			}
			if inst != n.Instance || inst.IsZero() {
				t.Errorf("instance %v, want %v", inst, n.Instance)
			}
		})
	}
}
