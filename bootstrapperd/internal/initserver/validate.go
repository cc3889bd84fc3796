package initserver

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"

	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
)

// Limits of an InitRequest. A real request is far below each; they exist
// so that what the node does with a request, and every error it sends
// back, stays small whatever a peer sends.
const (
	// maxInitSecret is bcrypt's input limit.
	maxInitSecret = 72
	// maxClusterName is a DNS label.
	maxClusterName = 63
	// maxSAN is a DNS name; an IP address literal is shorter.
	maxSAN = 253
	// maxSANs is generous for what a control plane is reached by (a load
	// balancer, a few DNS aliases, their addresses); it keeps the API
	// server's certificate, which every client downloads, small.
	maxSANs = 64
	// maxVersion fits any "v1.36.3-rc.1" and then some.
	maxVersion = 32
	// maxServiceCIDR fits the longest IPv6 prefix (39 + "/128") and
	// then some.
	maxServiceCIDR = 64

	// MaxRequestSize bounds an InitRequest on the wire, for the gRPC
	// server's MaxRecvMsgSize: a request with every field at its limit
	// is under 17 KiB; the rest is room for fields to come.
	MaxRequestSize = 32 << 10

	// maxQuoted is how much of a bad value an error quotes.
	maxQuoted = 64
	// maxListed is how many bad SANs an error names; the rest it counts.
	maxListed = 3
)

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// dnsName is a DNS name of labels as above; its length is checked apart.
var dnsName = regexp.MustCompile(`^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)

// validate checks everything about a request that needs no outside
// information, before anything on the node is touched; the init secret
// is checked before, by checkInitSecret. Each error says which field is
// wrong and how. Every field's length is checked before its content, and
// an error quotes at most maxQuoted bytes of a value, so neither the work
// nor the error grows with the request.
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
	if v := req.GetKubernetesVersion(); len(v) > maxVersion {
		errs = append(errs, fmt.Errorf("the Kubernetes version %s is longer than %d bytes: want a release such as v1.36.3", quote(v), maxVersion))
	} else if err := supported(v); err != nil {
		errs = append(errs, err)
	}
	if name := req.GetClusterName(); len(name) > maxClusterName || !dnsLabel.MatchString(name) {
		errs = append(errs, fmt.Errorf("cluster name %s is not a DNS label (lowercase letters, digits and '-', at most %d)", quote(name), maxClusterName))
	}
	if err := validateSANs(req.GetApiServerCertSans()); err != nil {
		errs = append(errs, err)
	}
	if err := validateServiceCIDR(req.GetServiceCidr()); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// validateSANs names the first maxListed bad SANs and counts the rest.
func validateSANs(sans []string) error {
	if len(sans) > maxSANs {
		return fmt.Errorf("%d API server SANs, at most %d: list only the names and addresses clients reach the control plane by", len(sans), maxSANs)
	}
	var bad []string
	n := 0
	for _, san := range sans {
		if validSAN(san) {
			continue
		}
		n++
		if len(bad) < maxListed {
			bad = append(bad, quote(san))
		}
	}
	if n == 0 {
		return nil
	}
	list := strings.Join(bad, ", ")
	if n > len(bad) {
		list += fmt.Sprintf(" and %d more", n-len(bad))
	}
	return fmt.Errorf("API server SANs must each be an IP address or a DNS name of at most %d bytes; %d of %d are not: %s", maxSAN, n, len(sans), list)
}

func validSAN(san string) bool {
	if len(san) > maxSAN {
		return false
	}
	if _, err := netip.ParseAddr(san); err == nil {
		return true
	}
	return dnsName.MatchString(san)
}

func validateServiceCIDR(cidr string) error {
	if len(cidr) > maxServiceCIDR {
		return fmt.Errorf("service CIDR %s is longer than %d bytes: want a range such as 10.96.0.0/12", quote(cidr), maxServiceCIDR)
	}
	p, err := netip.ParsePrefix(cidr)
	switch {
	case err != nil:
		return fmt.Errorf("service CIDR %s: %v", quote(cidr), err)
	case p != p.Masked():
		return fmt.Errorf("service CIDR %s has host bits set (did you mean %s?)", quote(cidr), p.Masked())
	case p.Addr().Is4() && p.Bits() > 28:
		return fmt.Errorf("service CIDR %s is too small for a cluster's services", quote(cidr))
	}
	return nil
}

// quote quotes s for an error, or, if s is long, its first maxQuoted
// bytes and its length.
func quote(s string) string {
	if len(s) <= maxQuoted {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:maxQuoted], len(s))
}
