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
	// pinned holds, once set, the node the connection's first call
	// proved: gRPC dials again after a lost connection, and whatever
	// answers then must be that node, as locked as it was.
	pinned *pin
}

type pin struct {
	instance attestation.Instance
	locked   bool
}

// pin makes every later handshake prove instance, locked as locked.
func (a *anyImage) pin(instance attestation.Instance, locked bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pinned = &pin{instance: instance, locked: locked}
}

// checkPin refuses a handshake after the first that proves another node,
// or the same node in another state of its lock.
func (a *anyImage) checkPin(got attestation.Instance, locked bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch p := a.pinned; {
	case p == nil:
		return nil
	case got != p.instance:
		return fmt.Errorf("the connection was made to %s, and another machine answered when it was made again: %s", describe(p.instance), describe(got))
	case locked != p.locked:
		return fmt.Errorf("%s was %s when the connection was made, and is %s now", describe(got), lockState(p.locked), lockState(locked))
	}
	return nil
}

func describe(i attestation.Instance) string {
	if i.IsZero() {
		return "a machine whose platform certified no instance"
	}
	return "instance " + i.Name
}

func lockState(locked bool) string {
	if locked {
		return "locked to this cluster"
	}
	return "not locked to a cluster"
}

func (a *anyImage) Variant() variant.Variant { return a.cs[0].locked.Variant() }

func (a *anyImage) Validate(ctx context.Context, doc, nonce []byte) ([]byte, error) {
	p, err := a.ValidateProof(ctx, doc, nonce)
	return p.UserData, err
}

func (a *anyImage) ValidateProof(ctx context.Context, doc, nonce []byte) (attestation.Proof, error) {
	p, name, locked, err := a.validate(ctx, doc, nonce)
	if err != nil {
		return attestation.Proof{}, err
	}
	if err := a.checkPin(p.Instance, locked); err != nil {
		return attestation.Proof{}, err
	}
	a.matched(name, locked)
	return p, nil
}

// validate checks the node's attestation against each image, locked and
// not, and says which it matched.
func (a *anyImage) validate(ctx context.Context, doc, nonce []byte) (attestation.Proof, string, bool, error) {
	var why []string
	for _, c := range a.cs {
		p, err := c.locked.ValidateProof(ctx, doc, nonce)
		if err == nil {
			return p, c.name, true, nil
		}
		// Only a mismatch of measurements makes another way worth
		// trying; a forged or stale attestation fails them all alike.
		if !isMismatch(err) {
			return attestation.Proof{}, "", false, err
		}
		p, uerr := c.unlocked.ValidateProof(ctx, doc, nonce)
		if uerr == nil {
			return p, c.name, false, nil
		}
		// The image is right and only the lock differs: that is all the
		// owner needs to know.
		if onlyLock(err) && onlyLock(uerr) {
			return attestation.Proof{}, "", false, fmt.Errorf("the node runs the image of %s but is not locked to this cluster (PCR %d differs): it belongs to another cluster: %w", c.name, nodelock.PCR, err)
		}
		why = append(why, c.name+": "+err.Error())
	}
	if len(a.cs) == 1 {
		return attestation.Proof{}, "", false, fmt.Errorf("the node does not run the image of %s: %s", a.cs[0].name, strings.TrimPrefix(why[0], a.cs[0].name+": "))
	}
	return attestation.Proof{}, "", false, fmt.Errorf("the node matches none of the accepted images: %s", strings.Join(why, "; "))
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
