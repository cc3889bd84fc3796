package measurements

import (
	"bytes"
	"errors"
	"fmt"
)

// Mismatch is a PCR whose actual value is not the expected one.
type Mismatch struct {
	PCR      uint32
	Expected []byte
	// Actual is nil if the attestation has no value for the PCR.
	Actual []byte
}

// String describes the mismatch in the words of MismatchError.
func (mm Mismatch) String() string {
	if len(mm.Actual) == 0 {
		return fmt.Sprintf("PCR %d mismatch: expected %x, got no value", mm.PCR, mm.Expected)
	}
	return fmt.Sprintf("PCR %d mismatch: expected %x, got %x", mm.PCR, mm.Expected, mm.Actual)
}

// MismatchError is an enforced PCR that does not have its expected value.
// Callers find it with errors.As, for instance to add the component that
// the measurement log says changed.
type MismatchError Mismatch

func (e *MismatchError) Error() string { return Mismatch(*e).String() }

// MismatchedPCRs returns the PCR of every *MismatchError in err's tree, in
// order: Compare joins one per PCR, and callers wrap what it returns.
func MismatchedPCRs(err error) []uint32 {
	switch e := err.(type) { //nolint:errorlint // walks the tree itself, as errors.As would
	case *MismatchError:
		return []uint32{e.PCR}
	case interface{ Unwrap() []error }:
		var out []uint32
		for _, inner := range e.Unwrap() {
			out = append(out, MismatchedPCRs(inner)...)
		}
		return out
	case interface{ Unwrap() error }:
		return MismatchedPCRs(e.Unwrap())
	}
	return nil
}

// Compare checks actual PCR values against m. For every PCR in m, in
// ascending order:
//
//   - a PCR whose actual value equals the expected value passes;
//   - an enforced PCR that is missing from actual or differs yields a
//     *MismatchError; all of them are joined into the returned error;
//   - a warn-only PCR that is missing or differs is returned in warnings,
//     for the caller to log, and does not fail the comparison.
//
// PCRs in actual that m does not mention are not checked. If m itself is
// invalid (see Validate), in particular empty, Compare fails rather than
// accept every node. Compare has no side effects; the returned values do
// not share memory with m or actual.
func (m M) Compare(actual map[uint32][]byte) (warnings []Mismatch, err error) {
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("compare measurements: %w", err)
	}
	var errs []error
	for _, pcr := range m.pcrs() {
		want := m[pcr]
		got := actual[pcr]
		if bytes.Equal(got, want.Expected) {
			continue
		}
		mm := Mismatch{PCR: pcr, Expected: bytes.Clone(want.Expected), Actual: bytes.Clone(got)}
		if want.WarnOnly {
			warnings = append(warnings, mm)
			continue
		}
		e := MismatchError(mm)
		errs = append(errs, &e)
	}
	return warnings, errors.Join(errs...)
}
