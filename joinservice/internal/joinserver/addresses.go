package joinserver

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/records/admitted"
)

// Reserved is what belongs to the cluster itself: no node may state an
// address in Networks or take one of Names.
type Reserved struct {
	Networks []Network
	Names    []string
}

// Network is a range of the cluster's own addresses (a single one, /32
// or /128, for an address of the API server's).
type Network struct {
	Name   string // what it is, for a refusal: "the Service network"
	Prefix netip.Prefix
}

// kubeadmAPIServerNames are the names kubeadm gives every API server's
// certificate besides the configured ones (its default DNS domain,
// cluster.local, which Orrery keeps): in-cluster clients reach the API
// server by them. A node so named would get a serving certificate for
// one; in a cluster whose kubelets' certificates come from the cluster CA
// that is a certificate every pod takes for the API server's.
var kubeadmAPIServerNames = []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}

// nodeAddresses reads the addresses a joining node states, which come
// from the host's metadata, and refuses those that are not the node's
// to state: a serving certificate approved for the endpoint's address,
// or for a Service's, would let the node's kubelet answer in the
// API server's place. inst is the node.
func (s *Server) nodeAddresses(ctx context.Context, inst attestation.Instance, text []string) ([]netip.Addr, error) {
	if len(text) == 0 {
		return nil, status.Error(codes.InvalidArgument, "the join request states no node address: the node's image is older than this join service; boot the node from the cluster's current image")
	}
	addrs, err := admitted.ParseAddresses(text)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "the node's addresses: %v", err)
	}
	var reserved Reserved
	if s.cfg.Reserved != nil {
		if reserved, err = s.cfg.Reserved(ctx); err != nil {
			return nil, status.Errorf(codes.Unavailable, "read what the cluster reserves for itself: %v", err)
		}
	}
	host := endpointHost(s.cfg.Endpoint)
	endpoint, err := netip.ParseAddr(host)
	if err != nil && host != "" {
		reserved.Names = append(reserved.Names, host)
	}
	reserved.Names = append(reserved.Names, kubeadmAPIServerNames...)
	for _, name := range reserved.Names {
		if strings.EqualFold(strings.TrimSuffix(name, "."), inst.Name) {
			return nil, status.Errorf(codes.PermissionDenied, "node %s has a name of the cluster's API server (%s): a node may not take it; give the VM another name", inst.Name, name)
		}
	}
	for _, a := range addrs {
		what := ""
		if a == endpoint.Unmap() {
			what = "the cluster's endpoint " + s.cfg.Endpoint
		}
		for _, n := range reserved.Networks {
			switch {
			case what != "" || !n.Prefix.Contains(a):
			case n.Prefix.IsSingleIP():
				what = n.Name
			default:
				what = fmt.Sprintf("in %s %s", n.Name, n.Prefix)
			}
		}
		if what != "" {
			return nil, status.Errorf(codes.PermissionDenied, "the node states address %s, which is %s: a node states only addresses of its own network interfaces; check the addresses the metadata service gives this VM", a, what)
		}
	}
	return addrs, nil
}

// endpointHost is the host of a host:port endpoint, or "" if it has none.
func endpointHost(endpoint string) string {
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		return ""
	}
	return host
}
