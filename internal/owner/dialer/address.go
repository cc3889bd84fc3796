package dialer

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ParseAddress reads a node address as the owner types it: a host name,
// an IPv4 address, an IPv6 address (bare or in brackets), each with or
// without a port, and returns HOST:PORT with port filled in when none was
// given. A URL, an empty or malformed host, or a port out of range is an
// error that says what is accepted.
func ParseAddress(node string, port int) (string, error) {
	host, p, err := splitNode(node)
	if err != nil {
		return "", fmt.Errorf("node address %q: %w; want HOST, HOST:PORT, IP or [IPv6]:PORT", node, err)
	}
	if p == "" {
		p = strconv.Itoa(port)
	}
	return net.JoinHostPort(host, p), nil
}

func splitNode(node string) (host, port string, err error) {
	if scheme, _, ok := strings.Cut(node, "://"); ok {
		return "", "", fmt.Errorf("it is a URL: drop %q", scheme+"://")
	}
	if strings.ContainsAny(node, "/?# \t") {
		return "", "", fmt.Errorf("a node address has no path, query or spaces")
	}
	if a, err := parseIP(node); err == nil {
		return a.String(), "", nil
	} else if errors.Is(err, errZone) {
		return "", "", err
	}
	if strings.HasPrefix(node, "[") && strings.HasSuffix(node, "]") {
		a, err := parseIP(node[1 : len(node)-1])
		if errors.Is(err, errZone) {
			return "", "", err
		}
		if err != nil || !a.Is6() {
			return "", "", fmt.Errorf("%s is not an IPv6 address", node)
		}
		return a.String(), "", nil
	}
	host, port = node, ""
	if h, p, err := net.SplitHostPort(node); err == nil {
		host, port = h, p
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "", "", fmt.Errorf("port %q is not a number from 1 to 65535", p)
		}
	} else if strings.Contains(node, ":") {
		return "", "", fmt.Errorf("cannot split it into host and port (an IPv6 address with a port goes in brackets)")
	}
	if a, err := parseIP(host); err == nil {
		return a.String(), port, nil
	} else if errors.Is(err, errZone) {
		return "", "", err
	}
	if host == "" {
		return "", "", fmt.Errorf("no host")
	}
	if errs := validation.IsDNS1123Subdomain(strings.ToLower(host)); len(errs) > 0 {
		return "", "", fmt.Errorf("%q is neither an IP address nor a host name", host)
	}
	return host, port, nil
}

var errZone = errors.New("an IPv6 zone is an interface name: letters, digits, '.', '_' and '-'")

// parseIP is netip.ParseAddr, refusing zones that are not interface names:
// netip takes any text after '%', and a zone holding a bracket or a colon
// makes HOST:PORT that nothing, this function included, can split again.
func parseIP(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return a, err
	}
	for _, r := range a.Zone() {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return netip.Addr{}, errZone
		}
	}
	return a, nil
}
