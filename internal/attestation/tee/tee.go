// Package tee holds what the hardware-rooted attestation variants (AMD
// SEV-SNP, Intel TDX) share: how a report binds an attested TLS session,
// the values their policies hold (an expected value, a minimum version),
// how a policy check that failed is reported, how a report's fields are
// shown to the owner, and how the owner's collateral cache is read.
//
// The cryptography (report signatures, the vendor's certificate chain,
// revocation, TCB status) is done by github.com/google/go-sev-guest and
// github.com/google/go-tdx-guest in the packages snp and tdx; this
// package only names things.
package tee

import (
	"fmt"

	"github.com/orrery-dev/orrery/internal/attestation"
)

// ReportDataSize is the size of the report data field of an SEV-SNP
// report and of a TD report: both are 64 bytes.
const ReportDataSize = 64

// ReportData is the report data a node asks its TEE to sign: the same
// binding digest its vTPM quote carries (attestation.BindingDigest over
// the verifier's nonce and the node's TLS key), followed by 32 zero
// bytes. A report is then as fresh and as bound to the TLS session as the
// quote, and useless to anyone without that session's key.
func ReportData(nonce, userData []byte) []byte {
	out := make([]byte, ReportDataSize)
	copy(out, attestation.BindingDigest(nonce, userData))
	return out
}

// Field is one field of a verified hardware report.
type Field = attestation.Field

// Mismatch is a report field that the owner's policy does not accept.
// Its message names the field, the value the report shows and the value
// the policy wants, so the owner can tell an attack from an update.
type Mismatch struct {
	// Field is the policy's name of the field, e.g. "measurement".
	Field string
	// Seen is the report's value, Wanted what the policy asks for (both
	// as the policy file writes them).
	Seen, Wanted string
	// Reason is the checking library's own words, if any.
	Reason string
}

func (m *Mismatch) Error() string {
	s := fmt.Sprintf("%s is %s, but the policy wants %s", m.Field, m.Seen, m.Wanted)
	if m.Reason != "" {
		s += " (" + m.Reason + ")"
	}
	return s
}
