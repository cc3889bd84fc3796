package setvalidator

import (
	"fmt"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/nodelock"
)

// JoinPolicy returns the measurements a joining or rejoining node must
// show to pass set m: m's own, with PCR 15 (nodelock.PCR) enforced as 32
// zero bytes whatever m says of it (missing, warn-only, or another value).
// Every validator the join service builds goes through it; it is code, not
// configuration, so no MeasurementSet can weaken it.
//
// Why: the node lock extends PCR 15 with the cluster ID when a node binds
// itself to a cluster, after its state disk key came (bootstrapperd's
// joinclient locks after its join ticket; the initrd's rejoin locks after
// its rejoin ticket opened the disk), and nothing else measures into it
// (image/README.md). A node that asks for a ticket has not locked yet, so
// a non-zero PCR 15 means a VM that opened some cluster's disk since it
// booted (for instance a VM booted with another cluster's disk, asking
// for this cluster's keys) or a node tampering with its TPM. A set
// without PCR 15, or with it warn-only, would admit such a VM.
//
// m is not changed. JoinPolicy refuses a set that enforces no PCR but 15:
// with the rule above such a set would admit any unlocked VM of any image.
func JoinPolicy(m measurements.M) (measurements.M, error) {
	enforced := false
	for pcr, want := range m {
		enforced = enforced || (pcr != nodelock.PCR && !want.WarnOnly)
	}
	if !enforced {
		return nil, fmt.Errorf("the set enforces no PCR besides %d, so any VM that has not locked itself to a cluster would pass: enforce at least PCRs 4, 9 and 11 (the image's measurements.json)", nodelock.PCR)
	}
	p := m.Copy()
	p[nodelock.PCR] = measurements.Measurement{Expected: make([]byte, measurements.DigestSize)}
	return p, nil
}

// lockedHint explains a refusal that err (a validator's) makes for PCR 15,
// and is "" for any other refusal.
func lockedHint(err error) string {
	for _, pcr := range measurements.MismatchedPCRs(err) {
		if pcr == nodelock.PCR {
			return fmt.Sprintf("; PCR %d is not zero, so this VM has locked itself to a cluster since it booted (it opened some cluster's state disk, or was initialised), and a node gets a join or rejoin ticket only before it locks", nodelock.PCR)
		}
	}
	return ""
}
