// Package metadata is a node's view of its cloud's metadata API, which tells
// the node who it is, who its peers are, where the control plane is and the
// hash of the init secret: the API's wire format and the client nodes use.
// The local cloud's server side is internal/cloud/metadataserver, which no
// node program imports.
//
// Like a cloud's, the service knows its callers by their source address.
// Nodes do not trust its answers for anything security-relevant: peers
// prove who they are by attestation, and the init secret hash only lets the
// party that created the VMs initialise the first one.
//
// Endpoints, all GET without query or body, all answering JSON:
//
//	/self            {"name": ..., "role": ..., "ip": ...} of the caller
//	/peers           [{"name", "role", "ip"}, ...] sorted by role, then name
//	/endpoint        {"endpoint": "<IP>:<API server port>"} of the control
//	                 planes: the cloud's load balancer in front of them,
//	                 or else the first control plane
//	/initsecrethash  {"hash": "<bcrypt hash of the init secret>"}
//	/sev-snp/report/<128 hex digits>
//	                 {"report": "<base64>"}: only for a VM whose /self says
//	                 "tee": "sev-snp-simulated"; the local cloud's simulated
//	                 AMD Secure Processor signs an SEV-SNP report for the
//	                 caller with that REPORT_DATA, and answers it with its
//	                 certificates (the kernel's extended report form)
//
// Errors answer {"error": "..."} with a 4xx status.
package metadata

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/orrery-dev/orrery/internal/nodename"
	"github.com/orrery-dev/orrery/internal/role"
)

// Address is where a VM finds the metadata service: the link-local
// address clouds use for theirs, and the local cloud too.
const Address = "169.254.169.254"

// DefaultBaseURL is Client.BaseURL for the service at Address.
const DefaultBaseURL = "http://" + Address

// Paths of the endpoints.
const (
	PathSelf           = "/self"
	PathPeers          = "/peers"
	PathEndpoint       = "/endpoint"
	PathInitSecretHash = "/initsecrethash"
	// PathSEVSNPReport is followed by the report data in hex.
	PathSEVSNPReport = "/sev-snp/report/"
)

// Source is what a node asks its cloud's metadata API: who it is, where
// its peers are (the control planes among them) and the control planes'
// endpoint. *Client is one.
type Source interface {
	Self(ctx context.Context) (Instance, error)
	Peers(ctx context.Context) ([]Instance, error)
	Endpoint(ctx context.Context) (netip.AddrPort, error)
}

// TEESimulatedSEVSNP is Instance.TEE of a VM the local cloud runs as a
// simulated SEV-SNP confidential VM: its reports come from the
// metadata service (PathSEVSNPReport), signed under the cloud's test
// root, and prove nothing about any CPU.
const TEESimulatedSEVSNP = "sev-snp-simulated"

// SEVSNPReportAnswer is the JSON answer of PathSEVSNPReport.
type SEVSNPReportAnswer struct {
	// Report is the report followed by its certificate table.
	Report []byte `json:"report"`
}

// Instance is one VM of the local cloud.
type Instance struct {
	// Name is the VM's (and Kubernetes node's) name: lowercase letters,
	// digits, '-' and '.', as Kubernetes requires of node names.
	Name string    `json:"name"`
	Role role.Role `json:"role"`
	// IP is the VM's address, from which it calls the API.
	IP netip.Addr `json:"ip"`
	// TEE names the confidential-computing hardware the VM has, as the
	// platform offers it: "" for none, or TEESimulatedSEVSNP.
	TEE string `json:"tee,omitempty"`
}

// EndpointAnswer is the JSON answer of /endpoint.
type EndpointAnswer struct {
	Endpoint string `json:"endpoint"`
}

// InitSecretHashAnswer is the JSON answer of /initsecrethash.
type InitSecretHashAnswer struct {
	Hash string `json:"hash"`
}

// ErrorAnswer is the JSON answer of every failed request.
type ErrorAnswer struct {
	Error string `json:"error"`
}

// Validate checks the instance's name, role and address.
func (in Instance) Validate() error {
	if !nodename.Valid(in.Name) {
		return fmt.Errorf("invalid instance name %q: use lowercase letters, digits and '-' in dot-separated labels (at most 253 bytes)", in.Name)
	}
	if err := in.Role.Validate(); err != nil {
		return fmt.Errorf("instance %s: %w", in.Name, err)
	}
	if !in.IP.IsValid() || in.IP.Zone() != "" || in.IP.Is4In6() {
		return fmt.Errorf("instance %s: invalid address %q: want a plain IPv4 or IPv6 address", in.Name, in.IP)
	}
	if in.TEE != "" && in.TEE != TEESimulatedSEVSNP {
		return fmt.Errorf("instance %s: unknown TEE %q (known: %q)", in.Name, in.TEE, TEESimulatedSEVSNP)
	}
	return nil
}

// CheckInstances validates each instance and that names and addresses are
// unique.
func CheckInstances(ins []Instance) error {
	names := map[string]bool{}
	ips := map[netip.Addr]bool{}
	for _, in := range ins {
		if err := in.Validate(); err != nil {
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

// JoinService is a place where a node may ask for a join or rejoin
// ticket.
type JoinService struct {
	// Name says what it is: a control plane's name, or "the control-plane
	// endpoint".
	Name string
	Addr netip.AddrPort
}

// endpointName is JoinService.Name of the control planes' endpoint.
const endpointName = "the control-plane endpoint"

// JoinServices lists where the node that src says it is may ask for a
// ticket, on port: the control planes' endpoint first (a cloud's load
// balancer, which passes the node to a control plane that is up), then
// every other control plane in turn, so that a node still joins when the
// endpoint does not answer. Neither answer is trusted: a join service
// proves itself by attestation. A node that is the only control plane
// gets none, since the endpoint can lead only to itself.
func JoinServices(ctx context.Context, src Source, port uint16) (Instance, []JoinService, error) {
	self, err := src.Self(ctx)
	if err != nil {
		return Instance{}, nil, fmt.Errorf("ask the metadata service who this node is: %w", err)
	}
	peers, err := src.Peers(ctx)
	if err != nil {
		return Instance{}, nil, fmt.Errorf("ask the metadata service for the control planes: %w", err)
	}
	var out []JoinService
	seen := map[netip.Addr]bool{self.IP: true}
	for _, p := range peers {
		if p.Role == role.ControlPlane && !seen[p.IP] {
			seen[p.IP] = true
			out = append(out, JoinService{Name: p.Name, Addr: netip.AddrPortFrom(p.IP, port)})
		}
	}
	if len(out) == 0 {
		return self, nil, nil
	}
	// A cloud without a load balancer names the first control plane,
	// which is on the list already.
	if ep, err := src.Endpoint(ctx); err == nil && !seen[ep.Addr()] {
		out = append([]JoinService{{Name: endpointName, Addr: netip.AddrPortFrom(ep.Addr(), port)}}, out...)
	}
	return self, out, nil
}
