package inspect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/nodelock"
)

// anyImage accepts a node that one of several images' validators accepts
// (during an upgrade a cluster runs two), and remembers which did.
type anyImage struct {
	names []string
	vs    []attestation.ProofValidator
	mu    sync.Mutex
	match string
}

func (a *anyImage) Variant() variant.Variant { return a.vs[0].Variant() }

func (a *anyImage) Validate(ctx context.Context, doc, nonce []byte) ([]byte, error) {
	p, err := a.ValidateProof(ctx, doc, nonce)
	return p.UserData, err
}

func (a *anyImage) ValidateProof(ctx context.Context, doc, nonce []byte) (attestation.Proof, error) {
	var why []string
	for i, v := range a.vs {
		p, err := v.ValidateProof(ctx, doc, nonce)
		if err == nil {
			a.mu.Lock()
			a.match = a.names[i]
			a.mu.Unlock()
			return p, nil
		}
		// Only a mismatch of measurements makes another image worth
		// trying; a forged or stale attestation fails them all alike.
		var mismatch *measurements.MismatchError
		if !errors.As(err, &mismatch) {
			return attestation.Proof{}, err
		}
		// The image is right and only the lock differs: say so first,
		// it is all the owner needs to know.
		if pcrs := measurements.MismatchedPCRs(err); len(pcrs) == 1 && pcrs[0] == nodelock.PCR {
			return attestation.Proof{}, fmt.Errorf("the node runs the image of %s but is not locked to this cluster (PCR %d differs): it belongs to another cluster, or is not part of one: %w", a.names[i], nodelock.PCR, err)
		}
		why = append(why, a.names[i]+": "+err.Error())
	}
	if len(a.vs) == 1 {
		return attestation.Proof{}, fmt.Errorf("the node does not run the image of %s: %s", a.names[0], strings.TrimPrefix(why[0], a.names[0]+": "))
	}
	return attestation.Proof{}, fmt.Errorf("the node matches none of the accepted images: %s", strings.Join(why, "; "))
}

func (a *anyImage) matched() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.match
}
