// Package clustersettings checks the settings an owner chooses for a new
// cluster: its Kubernetes version, name, API server names and service
// range. The owner's CLI checks them before it dials a node, so a typo is
// reported at once; the node checks them again, since a request is
// untrusted input there.
package clustersettings

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/orrery-dev/orrery/internal/clusternet"
)

// Settings are a new cluster's choices.
type Settings struct {
	KubernetesVersion string
	ClusterName       string
	APIServerSANs     []string
	ServiceCIDR       string
	// ControlPlaneEndpoint is the stable address of the control planes,
	// HOST:PORT (see CheckEndpoint); empty means the first control
	// plane's own address.
	ControlPlaneEndpoint string
}

// Limits of the settings. A real cluster is far below each; they exist so
// that what a node does with a request, and every error it sends back,
// stays small whatever a peer sends.
const (
	// MaxClusterName is a DNS label.
	MaxClusterName = 63
	// MaxSAN is a DNS name; an IP address literal is shorter.
	MaxSAN = 253
	// MaxSANs is generous for what a control plane is reached by (a load
	// balancer, a few DNS aliases, their addresses); it keeps the API
	// server's certificate, which every client downloads, small.
	MaxSANs = 64
	// MaxVersion fits any "v1.36.3-rc.1" and then some.
	MaxVersion = 32
	// MaxServiceCIDR fits the longest IPv6 prefix (39 + "/128") and
	// then some.
	MaxServiceCIDR = 64

	// maxQuoted is how much of a bad value an error quotes.
	maxQuoted = 64
	// maxListed is how many bad SANs an error names; the rest it counts.
	maxListed = 3
)

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// dnsName is a DNS name of labels as above; its length is checked apart.
var dnsName = regexp.MustCompile(`^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)

// podCIDR is the pods' range, which the services' must not overlap.
var podCIDR = netip.MustParsePrefix(clusternet.PodCIDR)

// Validate checks every setting and returns all that are wrong, each
// naming the setting and what is allowed. supported says whether the
// image carries a Kubernetes version (versions.Supported). Each value's
// length is checked before its content, and an error quotes at most a
// few dozen bytes of a value, so neither the work nor the error grows
// with the input.
func (s Settings) Validate(supported func(string) error) error {
	var errs []error
	if v := s.KubernetesVersion; len(v) > MaxVersion {
		errs = append(errs, fmt.Errorf("the Kubernetes version %s is longer than %d bytes: want a release such as v1.36.3", Quote(v), MaxVersion))
	} else if err := supported(v); err != nil {
		errs = append(errs, err)
	}
	if name := s.ClusterName; len(name) > MaxClusterName || !dnsLabel.MatchString(name) {
		errs = append(errs, fmt.Errorf("cluster name %s is not a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most %d)", Quote(name), MaxClusterName))
	}
	if err := validateSANs(s.APIServerSANs); err != nil {
		errs = append(errs, err)
	}
	if err := validateServiceCIDR(s.ServiceCIDR); err != nil {
		errs = append(errs, err)
	}
	if s.ControlPlaneEndpoint != "" {
		if err := CheckEndpoint(s.ControlPlaneEndpoint); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// validateSANs names the first maxListed bad SANs and counts the rest.
func validateSANs(sans []string) error {
	if len(sans) > MaxSANs {
		return fmt.Errorf("%d API server SANs, at most %d: list only the names and addresses clients reach the control plane by", len(sans), MaxSANs)
	}
	var bad []string
	n := 0
	for _, san := range sans {
		if validSAN(san) {
			continue
		}
		n++
		if len(bad) < maxListed {
			bad = append(bad, Quote(san))
		}
	}
	if n == 0 {
		return nil
	}
	list := strings.Join(bad, ", ")
	if n > len(bad) {
		list += fmt.Sprintf(" and %d more", n-len(bad))
	}
	return fmt.Errorf("API server SANs must each be an IP address or a DNS name of at most %d bytes; %d of %d are not: %s", MaxSAN, n, len(sans), list)
}

func validSAN(san string) bool {
	if len(san) > MaxSAN {
		return false
	}
	if _, err := netip.ParseAddr(san); err == nil {
		return true
	}
	return dnsName.MatchString(san)
}

func validateServiceCIDR(cidr string) error {
	if len(cidr) > MaxServiceCIDR {
		return fmt.Errorf("service CIDR %s is longer than %d bytes: want a range such as %s", Quote(cidr), MaxServiceCIDR, clusternet.DefaultServiceCIDR)
	}
	p, err := netip.ParsePrefix(cidr)
	switch {
	case err != nil:
		return fmt.Errorf("service CIDR %s is not an IP range: want one such as %s", Quote(cidr), clusternet.DefaultServiceCIDR)
	case p != p.Masked():
		return fmt.Errorf("service CIDR %s has host bits set (did you mean %s?)", Quote(cidr), p.Masked())
	case !p.Addr().Is4():
		return fmt.Errorf("service CIDR %s is not IPv4: the cluster's pod network (%s) is IPv4 only", Quote(cidr), podCIDR)
	case p.Bits() > 28:
		return fmt.Errorf("service CIDR %s is too small for a cluster's services: want /28 or larger", Quote(cidr))
	case p.Bits() < 12:
		// The API server's bitmap allocator refuses more than 2^20
		// addresses, and a cluster never needs them.
		return fmt.Errorf("service CIDR %s is too large: want /12 or smaller", Quote(cidr))
	case p.Overlaps(podCIDR):
		return fmt.Errorf("service CIDR %s overlaps the pods' range %s: choose another", Quote(cidr), podCIDR)
	}
	return nil
}

// CheckEndpoint checks a control-plane endpoint: HOST:PORT with an IP
// address or a DNS name and a port from 1 to 65535. It is what every
// kubeconfig and join ticket of the cluster names, and the API server's
// certificate carries HOST, so it cannot change after init.
func CheckEndpoint(endpoint string) error {
	host, port, err := net.SplitHostPort(endpoint)
	if len(endpoint) > MaxSAN+6 || err != nil {
		return fmt.Errorf("control-plane endpoint %s is not HOST:PORT, e.g. 10.42.0.2:%d", Quote(endpoint), clusternet.APIServerPort)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 || port != strconv.FormatUint(n, 10) {
		return fmt.Errorf("control-plane endpoint %s: port %s is not a number from 1 to 65535", Quote(endpoint), Quote(port))
	}
	if a, err := netip.ParseAddr(host); (err == nil && a.Zone() != "") || !validSAN(host) {
		return fmt.Errorf("control-plane endpoint %s: %s is neither an IP address without a zone nor a DNS name", Quote(endpoint), Quote(host))
	}
	return nil
}

// Quote quotes s for an error, or, if s is long, its first bytes and its
// length.
func Quote(s string) string {
	if len(s) <= maxQuoted {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:maxQuoted], len(s))
}
