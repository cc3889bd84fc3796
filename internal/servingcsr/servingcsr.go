// Package servingcsr decides kubelets' requests for serving certificates
// (signer kubernetes.io/kubelet-serving), which the API server then
// trusts when it connects to a kubelet for 'kubectl exec', 'logs' and
// 'port-forward'. A request is approved only when the node that asks is
// the node it names, and every name and address in it is one the cluster
// admitted for that node: root on a worker holds that worker's kubelet
// credential, and must not get a certificate for another node's address,
// which would let it answer for that node's kubelet.
//
// Who may ask: any kubelet (group system:nodes), for itself only.
// What proves it: the requester's user name (system:node:NAME, from its
// client certificate, which the join service's admission led to) and the
// admitted record of NAME.
// What the answer gives: a certificate the API server accepts as NAME's
// kubelet at the admitted addresses, and nowhere else.
package servingcsr

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	certv1 "k8s.io/api/certificates/v1"

	"github.com/orrery-dev/orrery/internal/records/admitted"
)

// Signer is the signer of kubelets' serving certificates.
const Signer = certv1.KubeletServingSignerName

const (
	nodeUserPrefix = "system:node:"
	nodesGroup     = "system:nodes"
)

// Admitted is what the cluster recorded of a node when it admitted it.
type Admitted struct {
	// Name is the node's name (its attested instance's).
	Name string
	// Addresses are the node's addresses as the join service saw them.
	Addresses []netip.Addr
	// Removed is set once the owner removed the node.
	Removed bool
}

// Lookup finds the admitted node of a name; ok is false if there is
// none.
type Lookup func(ctx context.Context, name string) (a Admitted, ok bool, err error)

// FromRecords is the admitted node called name among the cluster's
// records of admitted state disks: the addresses of every disk recorded
// for an instance of that name that the owner has not removed (a node
// has one disk; its records are one per disk it joined with), or, if
// the owner removed every one, a removed node.
func FromRecords(recs []admitted.Record, name string) (a Admitted, ok bool) {
	a = Admitted{Name: name, Removed: true}
	for _, r := range recs {
		if r.Instance.Name != name {
			continue
		}
		ok = true
		if r.Removed() {
			continue
		}
		a.Removed = false
		for _, addr := range r.Addresses {
			if !slices.Contains(a.Addresses, addr) {
				a.Addresses = append(a.Addresses, addr)
			}
		}
	}
	if !ok {
		return Admitted{}, false
	}
	if a.Removed {
		a.Addresses = nil
	}
	return a, true
}

// ErrNotRecorded is Decide's answer for a node the cluster has no record
// of yet: decide again later.
var ErrNotRecorded = errors.New("no admitted node is recorded under the requester's name yet")

// Refused is a request that must be denied, and why.
type Refused struct{ Reason string }

func (r *Refused) Error() string { return "kubelet serving certificate refused: " + r.Reason }

// NodeName is the node a request for a kubelet serving certificate
// comes from, or "" if its requester is not a node.
func NodeName(csr *certv1.CertificateSigningRequest) string {
	name, ok := strings.CutPrefix(csr.Spec.Username, nodeUserPrefix)
	if !ok || !slices.Contains(csr.Spec.Groups, nodesGroup) {
		return ""
	}
	return name
}

// Decide returns nil if csr, a request to Signer, may be approved, a
// *Refused if it must be denied, or another error if the admitted
// records could not be read or hold no node of the requester's name
// (ErrNotRecorded): decide again later.
func Decide(ctx context.Context, csr *certv1.CertificateSigningRequest, lookup Lookup) error {
	if csr.Spec.SignerName != Signer {
		return &Refused{fmt.Sprintf("signer %q is not %s", csr.Spec.SignerName, Signer)}
	}
	name := NodeName(csr)
	if name == "" {
		return &Refused{fmt.Sprintf("requested by %q, not a node (%s<name> in group %s)", csr.Spec.Username, nodeUserPrefix, nodesGroup)}
	}
	req, err := parseRequest(csr.Spec.Request)
	if err != nil {
		return &Refused{err.Error()}
	}
	if err := checkSubject(req, name); err != nil {
		return &Refused{err.Error()}
	}
	if err := checkUsages(csr.Spec.Usages); err != nil {
		return &Refused{err.Error()}
	}
	if err := checkLifetime(csr.Spec.ExpirationSeconds); err != nil {
		return &Refused{err.Error()}
	}
	node, ok, err := lookup(ctx, name)
	if err != nil {
		return fmt.Errorf("read the admitted record of node %s: %w", name, err)
	}
	switch {
	case !ok:
		// Not refused: the first control plane's kubelet asks before
		// 'orrery init' recorded its node, and a denial would cost it
		// a new request after a back-off. Nothing but the join service
		// (which records first) and kubeadm on the first control plane
		// gives a kubelet its credential, so this is no other node's.
		return fmt.Errorf("%w: %s", ErrNotRecorded, name)
	case node.Removed:
		return &Refused{fmt.Sprintf("node %s was removed by the owner", name)}
	}
	if len(req.DNSNames)+len(req.IPAddresses) == 0 {
		return &Refused{"the request names no DNS name or address"}
	}
	for _, dns := range req.DNSNames {
		if dns != name {
			return &Refused{fmt.Sprintf("DNS name %q is not the node's name %s", dns, name)}
		}
	}
	for _, ip := range req.IPAddresses {
		addr, ok := netip.AddrFromSlice(ip)
		if !ok || !slices.Contains(node.Addresses, addr.Unmap()) {
			return &Refused{fmt.Sprintf("address %s is not one node %s was admitted with (%s)", ip, name, addressList(node.Addresses))}
		}
	}
	return nil
}

// parseRequest reads a PEM certificate request and checks its signature.
func parseRequest(raw []byte) (*x509.CertificateRequest, error) {
	block, rest := pem.Decode(raw)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("the request is not a PEM CERTIFICATE REQUEST")
	}
	if len(strings.TrimSpace(string(rest))) != 0 {
		return nil, errors.New("the request has data after its PEM block")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse the certificate request: %w", err)
	}
	if err := req.CheckSignature(); err != nil {
		return nil, fmt.Errorf("the certificate request's signature: %w", err)
	}
	return req, nil
}

// checkSubject wants the subject and names a kubelet puts in its serving
// request: CN system:node:NAME, O system:nodes, no e-mail or URI names.
func checkSubject(req *x509.CertificateRequest, name string) error {
	if cn := req.Subject.CommonName; cn != nodeUserPrefix+name {
		return fmt.Errorf("common name %q is not %s%s, the requester", cn, nodeUserPrefix, name)
	}
	if o := req.Subject.Organization; !slices.Equal(o, []string{nodesGroup}) {
		return fmt.Errorf("organization %q is not [%s]", o, nodesGroup)
	}
	if len(req.EmailAddresses) > 0 || len(req.URIs) > 0 {
		return errors.New("the request names e-mail addresses or URIs")
	}
	return nil
}

// checkUsages wants server auth, and nothing a server certificate has no
// use for.
func checkUsages(usages []certv1.KeyUsage) error {
	allowed := []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageKeyEncipherment, certv1.UsageServerAuth}
	for _, u := range usages {
		if !slices.Contains(allowed, u) {
			return fmt.Errorf("usage %q is not one a kubelet's serving certificate needs", u)
		}
	}
	if !slices.Contains(usages, certv1.UsageServerAuth) {
		return errors.New("the request does not ask for server auth")
	}
	return nil
}

// checkLifetime wants a request that asks for at most
// admitted.ServingCertLifetime: without it the controller manager would
// sign for its --cluster-signing-duration, a week. The first control
// plane's kubelet asks before 'orrery init' installed the policy that
// sets it; that request is denied, and the kubelet asks again within
// seconds (its back-off starts at 2 s).
func checkLifetime(seconds *int32) error {
	limit := int64(admitted.ServingCertLifetime / time.Second)
	switch {
	case seconds == nil:
		return fmt.Errorf("the request asks for no lifetime (spec.expirationSeconds), so it would be signed for a week; at most %s is approved: the orrery-serving-lifetime admission policy sets it on every request, check that it is installed (kubectl get mutatingadmissionpolicy orrery-serving-lifetime)", admitted.ServingCertLifetime)
	case int64(*seconds) > limit:
		return fmt.Errorf("the request asks for %s (spec.expirationSeconds), longer than the %s that is approved", time.Duration(*seconds)*time.Second, admitted.ServingCertLifetime)
	}
	return nil
}

func addressList(addrs []netip.Addr) string {
	if len(addrs) == 0 {
		return "none recorded"
	}
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}
