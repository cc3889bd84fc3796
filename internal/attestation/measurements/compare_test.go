package measurements

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// compareExpected are the measurements TestCompare's cases compare
// against: two enforced PCRs and a warn-only one.
var compareExpected = M{
	4:  {Expected: digest(4)},
	9:  {Expected: digest(9)},
	11: {Expected: digest(11), WarnOnly: true},
}

// compareMatching are actual PCR values that match compareExpected.
var compareMatching = map[uint32][]byte{4: digest(4), 9: digest(9), 11: digest(11)}

// compareMatchingWith is a copy of compareMatching with pcr set to value,
// or removed if value is nil.
func compareMatchingWith(pcr uint32, value []byte) map[uint32][]byte {
	out := map[uint32][]byte{}
	for k, v := range compareMatching {
		out[k] = v
	}
	if value == nil {
		delete(out, pcr)
	} else {
		out[pcr] = value
	}
	return out
}

var compareOutcomeCases = map[string]struct {
	m            M
	actual       map[uint32][]byte
	wantWarnings []Mismatch
	wantErrs     []MismatchError
	wantErr      string
}{
	"all match": {m: compareExpected, actual: compareMatching},
	"extra actual PCRs are ignored": {
		m: compareExpected, actual: compareMatchingWith(0, digest(0xee)),
	},
	"enforced PCR differs": {
		m: compareExpected, actual: compareMatchingWith(4, digest(0xee)),
		wantErrs: []MismatchError{{PCR: 4, Expected: digest(4), Actual: digest(0xee)}},
	},
	"enforced PCR missing": {
		m: compareExpected, actual: compareMatchingWith(9, nil),
		wantErrs: []MismatchError{{PCR: 9, Expected: digest(9)}},
	},
	"enforced PCR empty": {
		m: compareExpected, actual: compareMatchingWith(9, []byte{}),
		wantErrs: []MismatchError{{PCR: 9, Expected: digest(9), Actual: []byte{}}},
	},
	"enforced PCR truncated": {
		m: compareExpected, actual: compareMatchingWith(9, digest(9)[:20]),
		wantErrs: []MismatchError{{PCR: 9, Expected: digest(9), Actual: digest(9)[:20]}},
	},
	"warn-only PCR differs": {
		m: compareExpected, actual: compareMatchingWith(11, digest(0xee)),
		wantWarnings: []Mismatch{{PCR: 11, Expected: digest(11), Actual: digest(0xee)}},
	},
	"warn-only PCR missing": {
		m: compareExpected, actual: compareMatchingWith(11, nil),
		wantWarnings: []Mismatch{{PCR: 11, Expected: digest(11)}},
	},
	"everything differs": {
		m: compareExpected, actual: map[uint32][]byte{4: digest(1), 9: digest(2), 11: digest(3)},
		wantWarnings: []Mismatch{{PCR: 11, Expected: digest(11), Actual: digest(3)}},
		wantErrs: []MismatchError{
			{PCR: 4, Expected: digest(4), Actual: digest(1)},
			{PCR: 9, Expected: digest(9), Actual: digest(2)},
		},
	},
	"nothing measured": {
		m: compareExpected, actual: nil,
		wantWarnings: []Mismatch{{PCR: 11, Expected: digest(11)}},
		wantErrs:     []MismatchError{{PCR: 4, Expected: digest(4)}, {PCR: 9, Expected: digest(9)}},
	},
	"no expected measurements": {
		m: M{}, actual: compareMatching, wantErr: "no measurements",
	},
	"invalid expected measurements": {
		m: M{4: {Expected: digest(4)[:8]}}, actual: compareMatching, wantErr: "PCR 4: expected value has 8 bytes",
	},
}

func TestCompare(t *testing.T) {
	for name, tc := range compareOutcomeCases {
		t.Run(name, func(t *testing.T) {
			warnings, err := tc.m.Compare(tc.actual)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Compare() error = %v, want one containing %q", err, tc.wantErr)
				}
				var mm *MismatchError
				if errors.As(err, &mm) {
					t.Errorf("Compare() of invalid measurements returned a mismatch: %v", mm)
				}
				return
			}
			if !mismatchesEqual(warnings, tc.wantWarnings) {
				t.Errorf("warnings = %v, want %v", warnings, tc.wantWarnings)
			}
			gotErrs := mismatchErrors(err)
			if len(gotErrs) != len(tc.wantErrs) {
				t.Fatalf("Compare() error = %v, want %d mismatches", err, len(tc.wantErrs))
			}
			for i, want := range tc.wantErrs {
				if !mismatchesEqual([]Mismatch{Mismatch(*gotErrs[i])}, []Mismatch{Mismatch(want)}) {
					t.Errorf("mismatch %d = %v, want %v", i, gotErrs[i], &want)
				}
			}
			if len(tc.wantErrs) > 0 {
				var first *MismatchError
				if !errors.As(err, &first) || first.PCR != tc.wantErrs[0].PCR {
					t.Errorf("errors.As found %v, want PCR %d", first, tc.wantErrs[0].PCR)
				}
			}
		})
	}
}

func TestCompareDoesNotAlias(t *testing.T) {
	m := M{4: {Expected: digest(4)}, 11: {Expected: digest(11), WarnOnly: true}}
	actual := map[uint32][]byte{4: digest(1), 11: digest(2)}
	warnings, err := m.Compare(actual)
	var mm *MismatchError
	if !errors.As(err, &mm) || len(warnings) != 1 {
		t.Fatalf("Compare() = %v, %v; want one mismatch and one warning", warnings, err)
	}
	mm.Expected[0], mm.Actual[0] = 0xff, 0xff
	warnings[0].Expected[0], warnings[0].Actual[0] = 0xff, 0xff
	if m[4].Expected[0] != 4 || m[11].Expected[0] != 11 || actual[4][0] != 1 || actual[11][0] != 2 {
		t.Error("changing a result changed the inputs")
	}
}

func TestMismatchMessage(t *testing.T) {
	testCases := map[string]struct {
		mm   MismatchError
		want string
	}{
		"differs": {
			mm:   MismatchError{PCR: 4, Expected: []byte{0xab, 0xcd}, Actual: []byte{0x01, 0x23}},
			want: "PCR 4 mismatch: expected abcd, got 0123",
		},
		"missing": {
			mm:   MismatchError{PCR: 11, Expected: []byte{0xab}},
			want: "PCR 11 mismatch: expected ab, got no value",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			if got := tc.mm.Error(); got != tc.want {
				t.Errorf("Error() = %q, want %q", got, tc.want)
			}
			if got := fmt.Sprint(Mismatch(tc.mm)); got != tc.want {
				t.Errorf("Mismatch.String() = %q, want %q", got, tc.want)
			}
		})
	}
}

// mismatchErrors unpacks the joined error Compare returns.
func mismatchErrors(err error) []*MismatchError {
	if err == nil {
		return nil
	}
	var errs []error
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		errs = joined.Unwrap()
	} else {
		errs = []error{err}
	}
	var out []*MismatchError
	for _, e := range errs {
		var mm *MismatchError
		if errors.As(e, &mm) {
			out = append(out, mm)
		}
	}
	return out
}

func mismatchesEqual(a, b []Mismatch) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].PCR != b[i].PCR || !bytes.Equal(a[i].Expected, b[i].Expected) ||
			!bytes.Equal(a[i].Actual, b[i].Actual) || (a[i].Actual == nil) != (b[i].Actual == nil) {
			return false
		}
	}
	return true
}

// Callers wrap Compare's joined errors, and look for the PCRs behind them.
func TestMismatchedPCRs(t *testing.T) {
	m := M{4: {Expected: bytes.Repeat([]byte{1}, 32)}, 11: {Expected: bytes.Repeat([]byte{2}, 32)}, 15: {Expected: make([]byte, 32)}}
	_, err := m.Compare(map[uint32][]byte{4: bytes.Repeat([]byte{1}, 32), 11: make([]byte, 32), 15: bytes.Repeat([]byte{3}, 32)})
	wrapped := fmt.Errorf("measurements do not match: %w; and more", err)
	for name, e := range map[string]error{"joined": err, "wrapped": wrapped, "wrapped twice": fmt.Errorf("node: %w", wrapped)} {
		if got := MismatchedPCRs(e); !slices.Equal(got, []uint32{11, 15}) {
			t.Errorf("%s: %v, want [11 15]", name, got)
		}
	}
	for _, e := range []error{nil, errors.New("PCR 11 mismatch"), fmt.Errorf("other: %v", err)} {
		if got := MismatchedPCRs(e); got != nil {
			t.Errorf("MismatchedPCRs(%v) = %v, want none", e, got)
		}
	}
}
