package launchendorsement_test

import (
	"encoding/pem"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation/gcp/launchendorsement"
	"github.com/orrery-dev/orrery/internal/attestation/gcp/launchendorsement/endorsementtest"
)

// FuzzVerify feeds the endorsement parser arbitrary bytes, seeded with
// a valid endorsement and its golden measurement alone: anything but an
// endorsement signed under the root is refused, without a panic.
func FuzzVerify(f *testing.F) {
	a := endorsementtest.NewAuthority(f, now)
	good := a.Endorse(f, document())
	f.Add(good)
	f.Add(endorsementtest.Golden(document(), a.Signer.Raw))
	f.Add([]byte{})
	roots, err := a.Policy().Pool()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, blob []byte) {
		g, err := launchendorsement.Verify(blob, roots, now)
		if err != nil {
			return
		}
		if g.Signer == nil || len(g.UEFIDigest) != 48 || (g.SNP == nil && g.TDX == nil) {
			t.Fatalf("accepted endorsement lacks a signer, a digest or a technology: %+v", g)
		}
	})
}

func pemOf(der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}
