package owner

import (
	"context"
	"errors"
	"fmt"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/validator"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/nodelock"
)

// initValidator checks the node's attestation for an init. A node that
// belongs to no cluster shows PCR 15 as zero, as the measurements say.
// Once an init has taken the node lock, PCR 15 holds the lock's value for
// that init's cluster ID, and no reboot-free way leads back to zero. So a
// retry of this owner's own init (retry: the master secret and the
// measurement salt both come from an earlier run) also accepts PCR 15
// locked to exactly the cluster ID they derive, which only a holder of
// both could have caused. Every other PCR is checked as before, and no
// other value of PCR 15 passes: a node locked to someone else's cluster
// is refused.
func initValidator(cfg validator.Config, ms keys.MasterSecret, measurementSalt []byte, retry bool) (attestation.ProofValidator, error) {
	fresh, err := validator.New(cfg)
	if err != nil {
		return nil, err
	}
	want, ok := cfg.Policy.PCRs[nodelock.PCR]
	if !retry || !ok {
		return fresh, nil
	}
	msec, err := ms.MeasurementSecret()
	if err != nil {
		return nil, err
	}
	clusterID, err := keys.ClusterID(msec, measurementSalt)
	if err != nil {
		return nil, err
	}
	locked := cfg
	locked.Policy = cfg.Policy.Copy()
	locked.Policy.PCRs[nodelock.PCR] = measurements.Measurement{Expected: nodelock.Expected(clusterID), WarnOnly: want.WarnOnly}
	lockedV, err := validator.New(locked)
	if err != nil {
		return nil, err
	}
	return freshOrLocked{fresh: fresh, locked: lockedV}, nil
}

// freshOrLocked accepts a node that fresh accepts, or else one that
// locked accepts: the two differ only in PCR 15. It passes on the instance
// the accepting validator read from the node's AK certificate: init
// records the first node as admitted for that VM, and a retried init that
// lost it left a control plane that could not rejoin after a reboot.
type freshOrLocked struct{ fresh, locked attestation.ProofValidator }

func (v freshOrLocked) Variant() variant.Variant { return v.fresh.Variant() }

func (v freshOrLocked) Validate(ctx context.Context, doc, nonce []byte) ([]byte, error) {
	p, err := v.ValidateProof(ctx, doc, nonce)
	return p.UserData, err
}

func (v freshOrLocked) ValidateProof(ctx context.Context, doc, nonce []byte) (attestation.Proof, error) {
	p, err := v.fresh.ValidateProof(ctx, doc, nonce)
	if err == nil {
		return p, nil
	}
	var mismatch *measurements.MismatchError
	if !errors.As(err, &mismatch) {
		return attestation.Proof{}, err
	}
	p, lockedErr := v.locked.ValidateProof(ctx, doc, nonce)
	if lockedErr == nil {
		return p, nil
	}
	return attestation.Proof{}, fmt.Errorf("%w; nor does it show the node lock of this cluster's own earlier init: %v", err, lockedErr)
}
