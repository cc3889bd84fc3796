package dialer

import (
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
	if a, err := netip.ParseAddr(node); err == nil {
		return a.String(), "", nil
	}
	if strings.HasPrefix(node, "[") && strings.HasSuffix(node, "]") {
		a, err := netip.ParseAddr(node[1 : len(node)-1])
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
	if a, err := netip.ParseAddr(host); err == nil {
		return a.String(), port, nil
	}
	if host == "" {
		return "", "", fmt.Errorf("no host")
	}
	if errs := validation.IsDNS1123Subdomain(strings.ToLower(host)); len(errs) > 0 {
		return "", "", fmt.Errorf("%q is neither an IP address nor a host name", host)
	}
	return host, port, nil
}
