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

// candidate is one image a node may run, checked two ways: locked to the
// owner's cluster (a running node), or not locked yet (a node waiting in
// its initrd for its disk key, PCR 15 zero).
type candidate struct {
	name             string
	locked, unlocked attestation.ProofValidator
}

// anyImage accepts a node that runs one of several images (during an
// upgrade a cluster runs two), and remembers which, and whether the node
// was locked.
type anyImage struct {
	cs     []candidate
	mu     sync.Mutex
	match  string
	isLock bool
}

func (a *anyImage) Variant() variant.Variant { return a.cs[0].locked.Variant() }

func (a *anyImage) Validate(ctx context.Context, doc, nonce []byte) ([]byte, error) {
	p, err := a.ValidateProof(ctx, doc, nonce)
	return p.UserData, err
}

func (a *anyImage) ValidateProof(ctx context.Context, doc, nonce []byte) (attestation.Proof, error) {
	var why []string
	for _, c := range a.cs {
		p, err := c.locked.ValidateProof(ctx, doc, nonce)
		if err == nil {
			a.matched(c.name, true)
			return p, nil
		}
		// Only a mismatch of measurements makes another way worth
		// trying; a forged or stale attestation fails them all alike.
		if !isMismatch(err) {
			return attestation.Proof{}, err
		}
		p, uerr := c.unlocked.ValidateProof(ctx, doc, nonce)
		if uerr == nil {
			a.matched(c.name, false)
			return p, nil
		}
		// The image is right and only the lock differs: that is all the
		// owner needs to know.
		if onlyLock(err) && onlyLock(uerr) {
			return attestation.Proof{}, fmt.Errorf("the node runs the image of %s but is not locked to this cluster (PCR %d differs): it belongs to another cluster: %w", c.name, nodelock.PCR, err)
		}
		why = append(why, c.name+": "+err.Error())
	}
	if len(a.cs) == 1 {
		return attestation.Proof{}, fmt.Errorf("the node does not run the image of %s: %s", a.cs[0].name, strings.TrimPrefix(why[0], a.cs[0].name+": "))
	}
	return attestation.Proof{}, fmt.Errorf("the node matches none of the accepted images: %s", strings.Join(why, "; "))
}

func isMismatch(err error) bool {
	var m *measurements.MismatchError
	return errors.As(err, &m)
}

func onlyLock(err error) bool {
	pcrs := measurements.MismatchedPCRs(err)
	return len(pcrs) == 1 && pcrs[0] == nodelock.PCR
}

func (a *anyImage) matched(name string, locked bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.match, a.isLock = name, locked
}

func (a *anyImage) result() (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.match, a.isLock
}
