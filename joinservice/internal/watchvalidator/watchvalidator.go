// Package watchvalidator validates attestations against measurements read
// from a file that may change while the service runs: a ConfigMap mounted
// into the join service's pod. The file is checked on every validation and
// re-read when its content changed, so new measurements apply without a
// restart; a file that does not parse keeps the last good measurements.
package watchvalidator

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
)

// Factory builds a validator for a set of measurements.
type Factory func(m measurements.M) (attestation.Validator, error)

// Validator is an attestation.Validator whose measurements follow a file.
type Validator struct {
	path    string
	variant variant.Variant
	build   Factory
	log     *slog.Logger

	mu      sync.Mutex
	digest  [32]byte
	current attestation.Validator
}

// New reads the measurements at path once (an error here is fatal: a join
// service without measurements must not start) and returns the validator.
func New(path string, v variant.Variant, build Factory, log *slog.Logger) (*Validator, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Validator{path: path, variant: v, build: build, log: log}
	if err := w.reload(); err != nil {
		return nil, err
	}
	return w, nil
}

// Variant implements attestation.Validator.
func (w *Validator) Variant() variant.Variant { return w.variant }

// Validate implements attestation.Validator. Refusals are logged with the
// reason (which names the PCR that differs).
func (w *Validator) Validate(ctx context.Context, doc, nonce []byte) ([]byte, error) {
	userData, _, err := w.ValidateInstance(ctx, doc, nonce)
	return userData, err
}

// ValidateInstance implements attestation.InstanceValidator: the instance
// is what the current validator tells, and the zero Instance if it is
// not an attestation.InstanceValidator.
func (w *Validator) ValidateInstance(ctx context.Context, doc, nonce []byte) ([]byte, attestation.Instance, error) {
	if err := w.reload(); err != nil {
		w.log.Error("measurements file changed but cannot be used; keeping the previous measurements", "path", w.path, "error", err)
	}
	w.mu.Lock()
	v := w.current
	w.mu.Unlock()
	var userData []byte
	var inst attestation.Instance
	var err error
	if iv, ok := v.(attestation.InstanceValidator); ok {
		userData, inst, err = iv.ValidateInstance(ctx, doc, nonce)
	} else {
		userData, err = v.Validate(ctx, doc, nonce)
	}
	if err != nil {
		w.log.Warn("attestation refused", "variant", w.variant.String(), "reason", err.Error())
		return nil, attestation.Instance{}, err
	}
	return userData, inst, nil
}

func (w *Validator) reload() error {
	raw, err := os.ReadFile(w.path)
	if err != nil {
		return fmt.Errorf("read measurements: %w", err)
	}
	digest := sha256.Sum256(raw)
	w.mu.Lock()
	same := w.current != nil && bytes.Equal(digest[:], w.digest[:])
	w.mu.Unlock()
	if same {
		return nil
	}
	m, err := measurements.ParseJSON(raw)
	if err != nil {
		return fmt.Errorf("measurements in %s: %w", w.path, err)
	}
	v, err := w.build(m)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.current, w.digest = v, digest
	w.mu.Unlock()
	w.log.Info("loaded measurements", "path", w.path, "pcrs", len(m))
	return nil
}
