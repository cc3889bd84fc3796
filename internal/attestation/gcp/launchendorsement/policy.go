package launchendorsement

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/orrery-dev/orrery/internal/strictjson"
)

// Policy is the owner's trust in Google's launch endorsements, in the
// SEV-SNP or TDX section of the measurements file, where it takes the
// place of a fixed launch measurement or MRTD:
//
//	{"roots": "<PEM of https://pki.goog/cloud_integrity/GCE-cc-tcb-root_1.crt>",
//	 "minimumSvn": 2}
//
// Any firmware Google endorsed under one of roots, at a security version
// of at least minimumSvn, is accepted: Google replaces its firmware
// without notice, and each build comes with its endorsement. minimumSvn
// must be given: at 0 any build Google ever endorsed passes, however
// vulnerable, and an owner has to write that down.
type Policy struct {
	// Roots holds one or more PEM certificates: Google's root, and its
	// successor during a rotation.
	Roots string `json:"roots"`
	// MinimumSVN is the lowest security version Google gave a firmware
	// build that the owner accepts; raise it when Google retires one.
	MinimumSVN uint32 `json:"minimumSvn"`
}

// UnmarshalJSON reads a policy strictly; roots must be given.
func (p *Policy) UnmarshalJSON(data []byte) error {
	var got Policy
	seen, err := strictjson.Object(data, map[string]func(json.RawMessage) error{
		"roots":      strictjson.String(&got.Roots),
		"minimumSvn": strictjson.Uint32(&got.MinimumSVN),
	})
	if err == nil {
		err = strictjson.Required(seen, "roots", "minimumSvn")
	}
	if err != nil {
		return err
	}
	*p = got
	return nil
}

// Pool parses the roots. Each must be a self-signed CA certificate: a
// signing certificate named as a root would make every endorsement it
// signed pass without its issuer's word.
func (p Policy) Pool() (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	rest := []byte(p.Roots)
	n := 0
	for len(strings.TrimSpace(string(rest))) > 0 {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil || block.Type != "CERTIFICATE" {
			return nil, errors.New("roots must hold only PEM certificates (Google serves its root in DER: convert it with openssl x509 -inform der -in GCE-cc-tcb-root_1.crt)")
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("roots[%d]: %w", n, err)
		}
		if !c.IsCA || c.CheckSignatureFrom(c) != nil {
			return nil, fmt.Errorf("roots[%d] (%q) is not a self-signed CA certificate: name Google's root, GCE-cc-tcb-root", n, c.Subject.CommonName)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, errors.New("roots holds no certificate: name Google's root, https://pki.goog/cloud_integrity/GCE-cc-tcb-root_1.crt, in PEM")
	}
	return pool, nil
}

// CheckChoice checks that a hardware policy section names either a fixed
// launch measurement (its member field, given when fixed is true) or
// Google's endorsements (p), not both and not neither, and that p is
// valid. It tells whether the fixed value is the one to check further.
func CheckChoice(field string, fixed bool, p *Policy) (checkFixed bool, err error) {
	switch {
	case !fixed && p == nil:
		return false, fmt.Errorf("%s is missing: without it any firmware would pass (on Google Cloud, name Google's root in gceLaunchEndorsement instead)", field)
	case fixed && p != nil:
		return false, fmt.Errorf("give %s or gceLaunchEndorsement, not both: which one would decide is not clear", field)
	case p != nil:
		if _, err := p.Pool(); err != nil {
			return false, fmt.Errorf("gceLaunchEndorsement.%w", err)
		}
		return false, nil
	}
	return true, nil
}

// SNPLaunch is an SEV-SNP launch measurement Google endorsed.
type SNPLaunch struct {
	Golden      *Golden
	LaunchVMSAs uint32
}

// Describe is one line for `orrery verify`.
func (l SNPLaunch) Describe() string {
	return fmt.Sprintf("%s, SEV-SNP svn %d, measurement for %d VMSAs at launch", l.Golden.Describe(), l.Golden.SNP.SVN, l.LaunchVMSAs)
}

// CheckSNP verifies the endorsement blob under the policy and that it
// endorses measurement at a security version the policy accepts.
func (p Policy) CheckSNP(blob, measurement []byte, now time.Time) (SNPLaunch, error) {
	g, err := p.verify(blob, now)
	if err != nil {
		return SNPLaunch{}, err
	}
	vmsas, err := g.LaunchVMSAsFor(measurement)
	if err != nil {
		return SNPLaunch{}, err
	}
	if g.SNP.SVN < p.MinimumSVN {
		return SNPLaunch{}, fmt.Errorf("the firmware's SEV-SNP security version is %d, below the owner's minimum %d: Google retired this firmware build; the host must launch the VM with current firmware", g.SNP.SVN, p.MinimumSVN)
	}
	return SNPLaunch{Golden: g, LaunchVMSAs: vmsas}, nil
}

// TDXLaunch is a TDX MRTD Google endorsed.
type TDXLaunch struct {
	Golden *Golden
	Config TDXMeasurement
}

// Describe is one line for `orrery verify`.
func (l TDXLaunch) Describe() string {
	return fmt.Sprintf("%s, TDX svn %d, MRTD for %d GiB", l.Golden.Describe(), l.Golden.TDX.SVN, l.Config.RAMGiB)
}

// CheckTDX verifies the endorsement blob under the policy and that it
// endorses mrtd at a security version the policy accepts.
func (p Policy) CheckTDX(blob, mrtd []byte, now time.Time) (TDXLaunch, error) {
	g, err := p.verify(blob, now)
	if err != nil {
		return TDXLaunch{}, err
	}
	cfg, err := g.TDXConfigurationFor(mrtd)
	if err != nil {
		return TDXLaunch{}, err
	}
	if g.TDX.SVN < p.MinimumSVN {
		return TDXLaunch{}, fmt.Errorf("the firmware's TDX security version is %d, below the owner's minimum %d: Google retired this firmware build; the host must launch the VM with current firmware", g.TDX.SVN, p.MinimumSVN)
	}
	return TDXLaunch{Golden: g, Config: cfg}, nil
}

func (p Policy) verify(blob []byte, now time.Time) (*Golden, error) {
	roots, err := p.Pool()
	if err != nil {
		return nil, err
	}
	return Verify(blob, roots, now)
}
