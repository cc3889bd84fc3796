package snp

import (
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"

	"github.com/orrery-dev/orrery/internal/attestation/gcp/launchendorsement"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// Policy is the owner's SEV-SNP section of the measurements file: what a
// node's attestation report must show. Every check but the launch
// measurement is optional; each has its own warnOnly, whose zero value
// enforces. Debug guests are refused whatever the policy says. The
// launch measurement is either fixed (measurement) or any that Google
// endorsed for its firmware (gceLaunchEndorsement, on Google Cloud).
//
// The JSON form is
//
//	{"measurement": {"expected": "<96 hex digits>", "warnOnly": false},
//	 or "gceLaunchEndorsement": {"roots": "<PEM>", "minimumSvn": 0},
//	 "guestPolicy": {"allowSmt": true, "allowMigrationAgent": false},
//	 "minimumTcb": {"bootloader": 3, "tee": 0, "snp": 8, "microcode": 115},
//	 "chipIds": {"allowed": ["<128 hex digits>", ...]},
//	 "minimumReportVersion": {"minimum": 2},
//	 "testRoot": {"notARealCpu": true, "ark": "<PEM>", "ask": "<PEM>"}}
type Policy struct {
	// Measurement is the launch measurement (SHA-384 of the initial
	// guest memory: the firmware). Required unless GCELaunchEndorsement
	// is given.
	Measurement *tee.Expected `json:"measurement,omitempty"`
	// GCELaunchEndorsement accepts any launch measurement Google
	// endorsed for its Confidential VM firmware under the roots it
	// names, instead of one fixed measurement: Google's VMM builds the
	// VMSAs and metadata pages the measurement covers, and only its
	// endorsements say what they measure to.
	GCELaunchEndorsement *launchendorsement.Policy `json:"gceLaunchEndorsement,omitempty"`
	// GuestPolicy says which guest policy bits are accepted besides the
	// always-refused debug bit. Nil accepts SMT and refuses a migration
	// agent.
	GuestPolicy *GuestPolicy `json:"guestPolicy,omitempty"`
	// MinimumTCB is the lowest reported TCB accepted, per component.
	MinimumTCB *TCB `json:"minimumTcb,omitempty"`
	// ChipIDs lists the chips accepted; nil or an empty list accepts any.
	ChipIDs *ChipIDs `json:"chipIds,omitempty"`
	// MinimumReportVersion is the lowest report format version accepted.
	MinimumReportVersion *tee.MinimumVersion `json:"minimumReportVersion,omitempty"`
	// TestRoot replaces AMD's roots with a test-only ARK and ASK, such as
	// the one the local cloud's simulated confidential VMs use. Reports
	// signed under it prove nothing about any CPU.
	TestRoot *TestRoot `json:"testRoot,omitempty"`
}

// GuestPolicy is the accepted guest policy, besides debug.
type GuestPolicy struct {
	AllowSMT            bool `json:"allowSmt"`
	AllowMigrationAgent bool `json:"allowMigrationAgent"`
	WarnOnly            bool `json:"warnOnly,omitempty"`
}

// TCB is a minimum security patch level per firmware component.
type TCB struct {
	Bootloader uint8 `json:"bootloader"`
	TEE        uint8 `json:"tee"`
	SNP        uint8 `json:"snp"`
	Microcode  uint8 `json:"microcode"`
	WarnOnly   bool  `json:"warnOnly,omitempty"`
}

// ChipIDs is a list of accepted chips.
type ChipIDs struct {
	Allowed  []HexBytes `json:"allowed"`
	WarnOnly bool       `json:"warnOnly,omitempty"`
}

// TestRoot is a test-only ARK and ASK. NotARealCPU must be true: the
// owner has to say, in those words, that reports under this root come
// from no real CPU.
type TestRoot struct {
	NotARealCPU bool   `json:"notARealCpu"`
	ARK         string `json:"ark"`
	ASK         string `json:"ask"`
	// CRL is the root's own product CRL (PEM), which the simulated chip
	// signs with its ARK: a test root has no KDS to fetch one from.
	CRL string `json:"crl,omitempty"`
}

// HexBytes is a byte string written as lowercase hex.
type HexBytes []byte

// MarshalJSON writes b as a hex string.
func (b HexBytes) MarshalJSON() ([]byte, error) { return json.Marshal(hex.EncodeToString(b)) }

// ParsePolicy reads a policy strictly: unknown fields, trailing data and
// values of the wrong size are errors.
func ParsePolicy(data []byte) (Policy, error) {
	var p Policy
	if err := p.UnmarshalJSON(data); err != nil {
		return Policy{}, fmt.Errorf("SEV-SNP policy: %w", err)
	}
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p, nil
}

// Validate checks that the policy names a launch measurement and that
// every value has its field's size.
func (p Policy) Validate() error {
	var errs []error
	fixed, err := launchendorsement.CheckChoice("measurement", p.Measurement != nil, p.GCELaunchEndorsement)
	switch {
	case err != nil:
		errs = append(errs, err)
	case fixed && len(p.Measurement.Expected) != abi.MeasurementSize:
		errs = append(errs, fmt.Errorf("measurement has %d bytes, not the %d of a SHA-384 digest", len(p.Measurement.Expected), abi.MeasurementSize))
	}
	if p.ChipIDs != nil {
		for i, id := range p.ChipIDs.Allowed {
			if len(id) != abi.ChipIDSize {
				errs = append(errs, fmt.Errorf("chipIds.allowed[%d] has %d bytes, not %d", i, len(id), abi.ChipIDSize))
			}
		}
	}
	if p.TestRoot != nil {
		if _, err := p.TestRoot.certificates(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("SEV-SNP policy: %w", err)
	}
	return nil
}

// parts is the TCB in go-sev-guest's form.
func (t TCB) parts() kds.TCBParts {
	return kds.TCBParts{BlSpl: t.Bootloader, TeeSpl: t.TEE, SnpSpl: t.SNP, UcodeSpl: t.Microcode}
}

func (t TCB) String() string {
	return fmt.Sprintf("bootloader %d, tee %d, snp %d, microcode %d", t.Bootloader, t.TEE, t.SNP, t.Microcode)
}

func tcbOf(p kds.TCBParts) TCB {
	return TCB{Bootloader: p.BlSpl, TEE: p.TeeSpl, SNP: p.SnpSpl, Microcode: p.UcodeSpl}
}

// testRootCerts are a TestRoot's parsed certificates, and its CRL (DER).
type testRootCerts struct {
	ark, ask *x509.Certificate
	crl      []byte
}

func (r TestRoot) certificates() (testRootCerts, error) {
	if !r.NotARealCPU {
		return testRootCerts{}, errors.New(`testRoot must say "notARealCpu": true: reports under a test root prove nothing about any CPU, and the owner has to accept that in those words`)
	}
	ark, err := parsePEMCert("testRoot.ark", r.ARK)
	if err != nil {
		return testRootCerts{}, err
	}
	ask, err := parsePEMCert("testRoot.ask", r.ASK)
	if err != nil {
		return testRootCerts{}, err
	}
	if err := ask.CheckSignatureFrom(ark); err != nil {
		return testRootCerts{}, fmt.Errorf("testRoot.ask is not signed by testRoot.ark: %w", err)
	}
	out := testRootCerts{ark: ark, ask: ask}
	if r.CRL != "" {
		block, rest := pem.Decode([]byte(r.CRL))
		if block == nil || block.Type != "X509 CRL" || strings.TrimSpace(string(rest)) != "" {
			return testRootCerts{}, errors.New("testRoot.crl must hold exactly one PEM CRL")
		}
		crl, err := x509.ParseRevocationList(block.Bytes)
		if err != nil {
			return testRootCerts{}, fmt.Errorf("testRoot.crl: %w", err)
		}
		if err := crl.CheckSignatureFrom(ark); err != nil {
			return testRootCerts{}, fmt.Errorf("testRoot.crl is not signed by testRoot.ark: %w", err)
		}
		out.crl = block.Bytes
	}
	return out, nil
}

func parsePEMCert(field, text string) (*x509.Certificate, error) {
	block, rest := pem.Decode([]byte(text))
	if block == nil || block.Type != "CERTIFICATE" || strings.TrimSpace(string(rest)) != "" {
		return nil, fmt.Errorf("%s must hold exactly one PEM certificate", field)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	return c, nil
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
