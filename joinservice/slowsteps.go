package main

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation"
)

// slowStep is how long a handshake's validation may take before the join
// service says so. Under TCG one takes less than a second; a step past this
// is what makes a joining node's handshake time out, and the log is the only
// place that tells which one. (The service's own quote logs itself: see
// vtpm.IssuerConfig.SlowIssue.)
const slowStep = 10 * time.Second

// timedValidator logs validations of a node's attestation that take
// longer than slowStep.
type timedValidator struct {
	attestation.ProofValidator
	log  *slog.Logger
	slow time.Duration // slowStep if zero
}

func (t timedValidator) ValidateProof(ctx context.Context, doc, nonce []byte) (attestation.Proof, error) {
	start := time.Now()
	p, err := t.ProofValidator.ValidateProof(ctx, doc, nonce)
	if d := time.Since(start); d > cmp.Or(t.slow, slowStep) {
		t.log.Warn("validating a node's attestation was slow (reading the measurement sets from the API server, or the control plane is short of CPU)",
			"variant", t.Variant().String(), "took", d.Round(time.Millisecond).String(), "failed", err != nil)
	}
	return p, err
}

func (t timedValidator) Validate(ctx context.Context, doc, nonce []byte) ([]byte, error) {
	p, err := t.ValidateProof(ctx, doc, nonce)
	return p.UserData, err
}
