package tdx

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/google/go-tdx-guest/abi"

	"github.com/orrery-dev/orrery/internal/attestation/gcp/launchendorsement"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
	"github.com/orrery-dev/orrery/internal/strictjson"
)

// Policy is the owner's TDX section of the measurements file: what a
// node's TD quote must show. Only MRTD is required; each check has its
// own warnOnly, whose zero value enforces. Debug TDs are refused
// whatever the policy says.
//
// The JSON form (decoded strictly: exact field names, no unknown or
// repeated fields, no null, no trailing data) is
//
//	{"mrtd": {"expected": "<96 hex digits>", "warnOnly": false},
//	 or "gceLaunchEndorsement": {"roots": "<PEM>", "minimumSvn": 0},
//	 "rtmr0": {"expected": "<96 hex digits>"}, ... "rtmr3": {...},
//	 "mrseam": {"expected": "<96 hex digits>"},
//	 "tdAttributes": {"expected": "<16 hex digits>"},
//	 "minimumTeeTcbSvn": {"minimum": "<32 hex digits>"},
//	 "minimumQeSvn": {"minimum": 4}}
//
// Byte strings are in the quote's byte order (TD attributes are little
// endian: "0000001000000000" is SEPT_VE_DISABLE alone).
type Policy struct {
	// MRTD is the TD's build-time measurement: the firmware image the
	// host loaded. Required unless GCELaunchEndorsement is given:
	// without either any firmware would pass.
	MRTD *tee.Expected
	// GCELaunchEndorsement accepts any MRTD Google endorsed for its
	// Confidential VM firmware under the roots it names, instead of one
	// fixed MRTD. The endorsement comes from the collateral cache
	// (gce-tdx-endorsement-<mrtd>.binarypb).
	GCELaunchEndorsement *launchendorsement.Policy
	// RTMR are the runtime measurement registers RTMR0 to RTMR3 (JSON
	// rtmr0 to rtmr3); nil leaves one unchecked.
	RTMR [4]*tee.Expected
	// MRSEAM is the TDX module's measurement. Intel's signature on the
	// module is always checked; this pins one build.
	MRSEAM *tee.Expected
	// TDAttributes must equal the quote's TD attributes exactly. A
	// value with the DEBUG bit is invalid.
	TDAttributes *tee.Expected
	// MinimumTEETCBSVN is the lowest TEE TCB SVN accepted, compared
	// byte by byte (each byte is one component's SVN).
	MinimumTEETCBSVN *MinimumSVN
	// MinimumQESVN is the lowest QE_SVN accepted, as the quote's header
	// states it. Some platforms leave that field 0 (the real test quote
	// does, while its QE report says ISV SVN 4); the QE's own TCB is
	// checked against Intel's QE identity whatever this says.
	MinimumQESVN *tee.MinimumVersion
}

// MinimumSVN is a lowest accepted SVN per component.
type MinimumSVN struct {
	Minimum  []byte
	WarnOnly bool
}

// tdAttributesDebug is TD attributes bit 0: the host can read and write
// a debug TD's memory and CPU state.
const tdAttributesDebug = 1 << 0

// rtmrNames are the JSON names of Policy.RTMR.
var rtmrNames = [4]string{"rtmr0", "rtmr1", "rtmr2", "rtmr3"}

// ParsePolicy reads a policy strictly and validates it.
func ParsePolicy(data []byte) (Policy, error) {
	var p Policy
	if _, err := strictjson.Object(data, p.members()); err != nil {
		return Policy{}, fmt.Errorf("TDX policy: %w", err)
	}
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p, nil
}

// UnmarshalJSON reads a policy strictly, as ParsePolicy does, so that a
// policy nested in a larger file is read the same way.
func (p *Policy) UnmarshalJSON(data []byte) error {
	got, err := ParsePolicy(data)
	if err != nil {
		return err
	}
	*p = got
	return nil
}

func (p *Policy) members() map[string]func(json.RawMessage) error {
	m := map[string]func(json.RawMessage) error{
		"mrtd":                 into(&p.MRTD),
		"gceLaunchEndorsement": into(&p.GCELaunchEndorsement),
		"mrseam":               into(&p.MRSEAM),
		"tdAttributes":         into(&p.TDAttributes),
		"minimumTeeTcbSvn":     into(&p.MinimumTEETCBSVN),
		"minimumQeSvn":         into(&p.MinimumQESVN),
	}
	for i, name := range rtmrNames {
		m[name] = into(&p.RTMR[i])
	}
	return m
}

// into decodes a member into a freshly allocated *T, through T's own
// strict UnmarshalJSON.
func into[T any, PT interface {
	*T
	json.Unmarshaler
}](dst **T) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		v := new(T)
		if err := PT(v).UnmarshalJSON(raw); err != nil {
			return err
		}
		*dst = v
		return nil
	}
}

// Validate checks that the policy names an MRTD, that every value has
// its field's size, and that it does not ask for a debug TD.
func (p Policy) Validate() error {
	var errs []error
	fixed, err := launchendorsement.CheckChoice("mrtd", p.MRTD != nil, p.GCELaunchEndorsement)
	switch {
	case err != nil:
		errs = append(errs, err)
	case fixed:
		errs = append(errs, checkSize("mrtd.expected", p.MRTD.Expected, abi.MrTdSize))
	}
	for i, r := range p.RTMR {
		if r != nil {
			errs = append(errs, checkSize(rtmrNames[i]+".expected", r.Expected, abi.RtmrSize))
		}
	}
	if p.MRSEAM != nil {
		errs = append(errs, checkSize("mrseam.expected", p.MRSEAM.Expected, abi.MrSeamSize))
	}
	if a := p.TDAttributes; a != nil {
		err := checkSize("tdAttributes.expected", a.Expected, abi.TdAttributesSize)
		if err == nil && binary.LittleEndian.Uint64(a.Expected)&tdAttributesDebug != 0 {
			err = errors.New("tdAttributes.expected has the DEBUG bit set: debug TDs are always refused, since the host can read and change their memory")
		}
		errs = append(errs, err)
	}
	if m := p.MinimumTEETCBSVN; m != nil {
		errs = append(errs, checkSize("minimumTeeTcbSvn.minimum", m.Minimum, abi.TeeTcbSvnSize))
	}
	if m := p.MinimumQESVN; m != nil && m.Minimum > math.MaxUint16 {
		errs = append(errs, fmt.Errorf("minimumQeSvn.minimum is %d, above the %d a QE SVN can be", m.Minimum, math.MaxUint16))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("TDX policy: %w", err)
	}
	return nil
}

func checkSize(field string, b []byte, size int) error {
	if len(b) != size {
		return fmt.Errorf("%s has %d bytes, want %d (%d hex digits)", field, len(b), size, 2*size)
	}
	return nil
}

// policyJSON is the wire form of a Policy.
type policyJSON struct {
	MRTD                 *tee.Expected             `json:"mrtd,omitempty"`
	GCELaunchEndorsement *launchendorsement.Policy `json:"gceLaunchEndorsement,omitempty"`
	RTMR0                *tee.Expected             `json:"rtmr0,omitempty"`
	RTMR1                *tee.Expected             `json:"rtmr1,omitempty"`
	RTMR2                *tee.Expected             `json:"rtmr2,omitempty"`
	RTMR3                *tee.Expected             `json:"rtmr3,omitempty"`
	MRSEAM               *tee.Expected             `json:"mrseam,omitempty"`
	TDAttributes         *tee.Expected             `json:"tdAttributes,omitempty"`
	MinimumTEETCBSVN     *MinimumSVN               `json:"minimumTeeTcbSvn,omitempty"`
	MinimumQESVN         *tee.MinimumVersion       `json:"minimumQeSvn,omitempty"`
}

// MarshalJSON writes the policy in the form ParsePolicy reads. It
// refuses a policy that Validate rejects, so what it writes can always
// be read back.
func (p Policy) MarshalJSON() ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(policyJSON{
		MRTD: p.MRTD, GCELaunchEndorsement: p.GCELaunchEndorsement, RTMR0: p.RTMR[0], RTMR1: p.RTMR[1], RTMR2: p.RTMR[2], RTMR3: p.RTMR[3],
		MRSEAM: p.MRSEAM, TDAttributes: p.TDAttributes,
		MinimumTEETCBSVN: p.MinimumTEETCBSVN, MinimumQESVN: p.MinimumQESVN,
	})
}

// MarshalJSON writes the minimum as lowercase hex.
func (m MinimumSVN) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Minimum  string `json:"minimum"`
		WarnOnly bool   `json:"warnOnly"`
	}{hex.EncodeToString(m.Minimum), m.WarnOnly})
}

// UnmarshalJSON reads {"minimum": "<hex>", "warnOnly": bool} strictly.
func (m *MinimumSVN) UnmarshalJSON(data []byte) error {
	var got MinimumSVN
	seen, err := strictjson.Object(data, map[string]func(json.RawMessage) error{
		"minimum":  strictjson.Hex(&got.Minimum),
		"warnOnly": strictjson.Bool(&got.WarnOnly),
	})
	if err != nil {
		return err
	}
	if !seen["minimum"] {
		return &strictjson.FieldError{Path: "minimum", Err: errors.New("is missing")}
	}
	*m = got
	return nil
}
