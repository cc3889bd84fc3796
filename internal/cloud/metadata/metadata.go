// Package metadata is the local cloud's metadata API, which tells a node
// who it is, who its peers are, where the control plane is and the hash of
// the init secret; and the client nodes use to ask it.
//
// The server side is the harness's stand-in for a cloud's metadata service.
// Like a cloud's, it knows its callers by their source address: a request
// from an address that is not one of the configured VMs gets 404. Nodes do
// not trust its answers for anything security-relevant: peers prove who
// they are by attestation, and the init secret hash only lets the party
// that created the VMs initialise the first one.
//
// Endpoints, all GET without query or body, all answering JSON:
//
//	/self            {"name": ..., "role": ..., "ip": ...} of the caller
//	/peers           [{"name", "role", "ip"}, ...] sorted by role, then name
//	/endpoint        {"endpoint": "<first control-plane IP>:<API server port>"}
//	/initsecrethash  {"hash": "<bcrypt hash of the init secret>"}
//
// Errors answer {"error": "..."} with a 4xx status.
package metadata

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/orrery-dev/orrery/internal/clusternet"
	"github.com/orrery-dev/orrery/internal/nodename"
)

// Roles of an instance.
const (
	RoleControlPlane = "control-plane"
	RoleWorker       = "worker"
)

// DefaultAPIServerPort is the Kubernetes API server's port when
// Config.APIServerPort is zero.
const DefaultAPIServerPort = clusternet.APIServerPort

// Paths of the endpoints.
const (
	pathSelf           = "/self"
	pathPeers          = "/peers"
	pathEndpoint       = "/endpoint"
	pathInitSecretHash = "/initsecrethash"
)

// Instance is one VM of the local cloud.
type Instance struct {
	// Name is the VM's (and Kubernetes node's) name: lowercase letters,
	// digits, '-' and '.', as Kubernetes requires of node names.
	Name string `json:"name"`
	// Role is RoleControlPlane or RoleWorker.
	Role string `json:"role"`
	// IP is the VM's address, from which it calls the API.
	IP netip.Addr `json:"ip"`
}

// endpointBody is the JSON answer of /endpoint.
type endpointBody struct {
	Endpoint string `json:"endpoint"`
}

// hashBody is the JSON answer of /initsecrethash.
type hashBody struct {
	Hash string `json:"hash"`
}

// errorBody is the JSON answer of every failed request.
type errorBody struct {
	Error string `json:"error"`
}

func (in Instance) validate() error {
	if !nodename.Valid(in.Name) {
		return fmt.Errorf("invalid instance name %q: use lowercase letters, digits and '-' in dot-separated labels (at most 253 bytes)", in.Name)
	}
	if in.Role != RoleControlPlane && in.Role != RoleWorker {
		return fmt.Errorf("instance %s: invalid role %q: want %q or %q", in.Name, in.Role, RoleControlPlane, RoleWorker)
	}
	if !in.IP.IsValid() || in.IP.Zone() != "" || in.IP.Is4In6() {
		return fmt.Errorf("instance %s: invalid address %q: want a plain IPv4 or IPv6 address", in.Name, in.IP)
	}
	return nil
}

// checkInstances validates each instance and that names and addresses are
// unique.
func checkInstances(ins []Instance) error {
	names := map[string]bool{}
	ips := map[netip.Addr]bool{}
	for _, in := range ins {
		if err := in.validate(); err != nil {
			return err
		}
		if names[in.Name] {
			return fmt.Errorf("instance name %q appears twice: give each VM its own", in.Name)
		}
		if ips[in.IP] {
			return fmt.Errorf("instance %s: address %s appears twice: give each VM its own", in.Name, in.IP)
		}
		names[in.Name] = true
		ips[in.IP] = true
	}
	return nil
}

// errNoControlPlane means there is no endpoint to hand out.
var errNoControlPlane = errors.New("no control-plane instance: add at least one with role " + RoleControlPlane)
