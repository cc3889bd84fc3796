package initserver

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"regexp"

	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
)

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// dnsName is a DNS name of labels as above, at most 253 characters.
var dnsName = regexp.MustCompile(`^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)

// validate checks everything about a request that needs no outside
// information, before anything on the node is touched. Each error says
// which field is wrong and how.
func validate(req *initpb.InitRequest, supported func(string) error) error {
	var errs []error
	ms := keys.MasterSecret{Key: req.GetMasterSecret(), Salt: req.GetMasterSecretSalt()}
	if err := ms.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("master secret: %w", err))
	}
	if n := len(req.GetMeasurementSalt()); n != keys.SaltSize {
		errs = append(errs, fmt.Errorf("measurement salt has %d bytes, want %d", n, keys.SaltSize))
	} else if bytes.Equal(req.GetMeasurementSalt(), req.GetMasterSecretSalt()) {
		errs = append(errs, errors.New("measurement salt equals the master secret salt: it must be generated separately"))
	}
	if err := supported(req.GetKubernetesVersion()); err != nil {
		errs = append(errs, err)
	}
	if n := len(req.GetInitSecret()); n == 0 || n > 72 {
		errs = append(errs, fmt.Errorf("init secret has %d bytes, want 1 to 72", n))
	}
	if !dnsLabel.MatchString(req.GetClusterName()) {
		errs = append(errs, fmt.Errorf("cluster name %q is not a DNS label (lowercase letters, digits and '-', at most 63)", req.GetClusterName()))
	}
	for _, san := range req.GetApiServerCertSans() {
		if _, err := netip.ParseAddr(san); err == nil {
			continue
		}
		if len(san) > 253 || !dnsName.MatchString(san) {
			errs = append(errs, fmt.Errorf("API server SAN %q is neither an IP address nor a DNS name", san))
		}
	}
	if p, err := netip.ParsePrefix(req.GetServiceCidr()); err != nil {
		errs = append(errs, fmt.Errorf("service CIDR %q: %v", req.GetServiceCidr(), err))
	} else if p != p.Masked() {
		errs = append(errs, fmt.Errorf("service CIDR %q has host bits set (did you mean %s?)", req.GetServiceCidr(), p.Masked()))
	} else if p.Addr().Is4() && p.Bits() > 28 {
		errs = append(errs, fmt.Errorf("service CIDR %q is too small for a cluster's services", req.GetServiceCidr()))
	}
	return errors.Join(errs...)
}
