package main

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation"
)

// slowStep is how long a handshake's quote or validation may take before
// the join service says so. Under TCG a quote takes a second or two and a
// validation less; a step past this is what makes a joining node's
// handshake time out, and the log is the only place that tells which one.
const slowStep = 10 * time.Second

// timedIssuer logs quotes that take longer than slowStep.
type timedIssuer struct {
	attestation.Issuer
	log  *slog.Logger
	slow time.Duration // slowStep if zero
}

func (t timedIssuer) Issue(ctx context.Context, userData, nonce []byte) ([]byte, error) {
	start := time.Now()
	doc, err := t.Issuer.Issue(ctx, userData, nonce)
	logIfSlow(t.log, t.slow, start, err, "the join service's own attestation for a handshake was slow (the control plane's vTPM, or its SEV-SNP report from the platform)")
	return doc, err
}

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
	logIfSlow(t.log, t.slow, start, err, "validating a node's attestation was slow (reading the measurement sets from the API server, or the control plane is short of CPU)", "variant", t.Variant().String())
	return p, err
}

func (t timedValidator) Validate(ctx context.Context, doc, nonce []byte) ([]byte, error) {
	p, err := t.ValidateProof(ctx, doc, nonce)
	return p.UserData, err
}

// logIfSlow logs msg if the step that began at start took longer than
// limit (slowStep if zero).
func logIfSlow(log *slog.Logger, limit time.Duration, start time.Time, err error, msg string, attrs ...any) {
	if d := time.Since(start); d > cmp.Or(limit, slowStep) {
		log.Warn(msg, append(attrs, "took", d.Round(time.Millisecond).String(), "failed", err != nil)...)
	}
}
