package servingcsr

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/records/admitted"
)

// admittedNodes is the cluster of the tests: worker-0 and worker-1,
// admitted at their addresses, and old-0, removed.
func admittedNodes(_ context.Context, name string) (Admitted, bool, error) {
	nodes := map[string]Admitted{
		"worker-0": {Name: "worker-0", Addresses: []netip.Addr{netip.MustParseAddr("10.42.1.0")}},
		"worker-1": {Name: "worker-1", Addresses: []netip.Addr{netip.MustParseAddr("10.42.1.1")}},
		"old-0":    {Name: "old-0", Addresses: []netip.Addr{netip.MustParseAddr("10.42.1.9")}, Removed: true},
	}
	a, ok := nodes[name]
	return a, ok, nil
}

// request is what a kubelet sends, changed by edit.
type request struct {
	username string
	groups   []string
	signer   string
	usages   []certv1.KeyUsage
	// seconds is spec.expirationSeconds (nil: none asked for).
	seconds *int32
	tmpl    x509.CertificateRequest
}

// policyLifetime is what the orrery-serving-lifetime admission policy
// sets on a kubelet's request.
var policyLifetime = int32(admitted.ServingCertLifetime / time.Second)

func kubeletRequest(node string, ips ...string) request {
	r := request{
		username: "system:node:" + node,
		groups:   []string{"system:nodes", "system:authenticated"},
		signer:   Signer,
		usages:   []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth},
		seconds:  &policyLifetime,
		tmpl: x509.CertificateRequest{
			Subject:  pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
			DNSNames: []string{node},
		},
	}
	for _, ip := range ips {
		r.tmpl.IPAddresses = append(r.tmpl.IPAddresses, net.ParseIP(ip))
	}
	return r
}

func (r request) csr(t testing.TB) *certv1.CertificateSigningRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &r.tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return &certv1.CertificateSigningRequest{Spec: certv1.CertificateSigningRequestSpec{
		Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
		SignerName: r.signer, Usages: r.usages, Username: r.username, Groups: r.groups,
		ExpirationSeconds: r.seconds,
	}}
}

func TestDecide(t *testing.T) {
	with := func(r request, edit func(*request)) request { edit(&r); return r }
	own := kubeletRequest("worker-0", "10.42.1.0")
	tests := map[string]struct {
		req     request
		refused string // "" to approve
	}{
		"its own name and address":            {req: own},
		"its own address, IPv4-mapped":        {req: kubeletRequest("worker-0", "::ffff:10.42.1.0")},
		"its own, for less than allowed":      {req: with(own, func(r *request) { r.seconds = ptr(int32(600)) })},
		"its own, for no lifetime asked":      {req: with(own, func(r *request) { r.seconds = nil }), refused: "asks for no lifetime"},
		"its own, for a second too long":      {req: with(own, func(r *request) { r.seconds = ptr(policyLifetime + 1) }), refused: "longer than the 6h0m0s"},
		"another node's address":              {req: kubeletRequest("worker-0", "10.42.1.0", "10.42.1.1"), refused: "address 10.42.1.1 is not one node worker-0 was admitted with (10.42.1.0)"},
		"another node's name as DNS name":     {req: with(own, func(r *request) { r.tmpl.DNSNames = []string{"worker-1"} }), refused: `DNS name "worker-1" is not the node's name worker-0`},
		"a wildcard DNS name":                 {req: with(own, func(r *request) { r.tmpl.DNSNames = []string{"*"} }), refused: "DNS name"},
		"another node's common name":          {req: with(own, func(r *request) { r.tmpl.Subject.CommonName = "system:node:worker-1" }), refused: "common name"},
		"another node's request, as worker-0": {req: with(kubeletRequest("worker-1", "10.42.1.1"), func(r *request) { r.username = "system:node:worker-0" }), refused: "common name"},
		"another organization":                {req: with(own, func(r *request) { r.tmpl.Subject.Organization = []string{"system:masters"} }), refused: "organization"},
		"an e-mail name":                      {req: with(own, func(r *request) { r.tmpl.EmailAddresses = []string{"a@b"} }), refused: "e-mail"},
		"a URI name":                          {req: with(own, func(r *request) { r.tmpl.URIs = []*url.URL{{Scheme: "spiffe", Host: "x"}} }), refused: "URIs"},
		"no names at all":                     {req: with(own, func(r *request) { r.tmpl.DNSNames, r.tmpl.IPAddresses = nil, nil }), refused: "names no DNS name or address"},
		"client auth too":                     {req: with(own, func(r *request) { r.usages = append(r.usages, certv1.UsageClientAuth) }), refused: `usage "client auth"`},
		"no server auth":                      {req: with(own, func(r *request) { r.usages = []certv1.KeyUsage{certv1.UsageDigitalSignature} }), refused: "server auth"},
		"a service account": {req: with(own, func(r *request) {
			r.username, r.groups = "system:serviceaccount:kube-system:x", []string{"system:serviceaccounts"}
		}), refused: "not a node"},
		"a node name without the nodes group": {req: with(own, func(r *request) { r.groups = []string{"system:authenticated"} }), refused: "not a node"},
		"another signer":                      {req: with(own, func(r *request) { r.signer = certv1.KubeAPIServerClientKubeletSignerName }), refused: "signer"},
		"a node the owner removed":            {req: kubeletRequest("old-0", "10.42.1.9"), refused: "removed by the owner"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			err := Decide(context.Background(), tt.req.csr(t), admittedNodes)
			if tt.refused == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var refused *Refused
			if !errors.As(err, &refused) || !strings.Contains(err.Error(), tt.refused) {
				t.Fatalf("err = %v, want a refusal saying %q", err, tt.refused)
			}
		})
	}
}

// Malformed requests are refused with their reason, never approved.
func TestDecideMalformed(t *testing.T) {
	good := kubeletRequest("worker-0", "10.42.1.0").csr(t)
	block, _ := pem.Decode(good.Spec.Request)
	flipped := append([]byte(nil), block.Bytes...)
	flipped[len(flipped)-5] ^= 1 // in the signature
	for name, tt := range map[string]struct {
		request []byte
		want    string
	}{
		"not PEM":            {[]byte("hello"), "not a PEM CERTIFICATE REQUEST"},
		"a certificate":      {pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: block.Bytes}), "not a PEM CERTIFICATE REQUEST"},
		"garbage DER":        {pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: []byte{0x30, 0x03, 1, 2}}), "parse the certificate request"},
		"truncated":          {pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: block.Bytes[:len(block.Bytes)/2]}), "parse the certificate request"},
		"a bad signature":    {pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: flipped}), "signature"},
		"a second PEM block": {append(append([]byte(nil), good.Spec.Request...), good.Spec.Request...), "data after its PEM block"},
	} {
		t.Run(name, func(t *testing.T) {
			csr := good.DeepCopy()
			csr.Spec.Request = tt.request
			err := Decide(context.Background(), csr, admittedNodes)
			var refused *Refused
			if !errors.As(err, &refused) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want a refusal saying %q", err, tt.want)
			}
		})
	}
}

// A node's addresses are those of its live records; a node whose every
// record the owner removed is removed, with no address.
func TestFromRecords(t *testing.T) {
	rec := func(disk, name string, removed bool, addrs ...string) admitted.Record {
		r := admitted.Record{DiskUUID: disk, Instance: attestation.Instance{Name: name, ID: name + "-id"}}
		if removed {
			r.RemovedAt = "2026-11-30T10:00:00Z"
		}
		for _, a := range addrs {
			r.Addresses = append(r.Addresses, netip.MustParseAddr(a))
		}
		return r
	}
	recs := []admitted.Record{
		rec("1", "worker-0", false, "10.42.1.0"),
		rec("2", "worker-0", true, "10.42.1.5"),
		rec("3", "worker-1", true, "10.42.1.1"),
		rec("4", "worker-2", false),
	}
	for _, tt := range []struct {
		name    string
		ok      bool
		removed bool
		addrs   string
	}{
		{"worker-0", true, false, "10.42.1.0"},
		{"worker-1", true, true, "none recorded"},
		{"worker-2", true, false, "none recorded"},
		{"worker-3", false, false, "none recorded"},
	} {
		a, ok := FromRecords(recs, tt.name)
		if ok != tt.ok || a.Removed != tt.removed || addressList(a.Addresses) != tt.addrs {
			t.Errorf("%s: %+v %v, want ok %v removed %v at %s", tt.name, a, ok, tt.ok, tt.removed, tt.addrs)
		}
	}
}

// A node with no record yet (the first control plane before 'orrery
// init' recorded it) is neither approved nor denied: decided later.
func TestDecideUnrecordedNode(t *testing.T) {
	err := Decide(context.Background(), kubeletRequest("stranger-0", "10.42.1.7").csr(t), admittedNodes)
	var refused *Refused
	if !errors.Is(err, ErrNotRecorded) || errors.As(err, &refused) || !strings.Contains(err.Error(), "stranger-0") {
		t.Fatalf("err = %v, want ErrNotRecorded naming the node", err)
	}
}

// A record that cannot be read is not a refusal: the request is decided
// again later.
func TestDecideLookupFails(t *testing.T) {
	err := Decide(context.Background(), kubeletRequest("worker-0", "10.42.1.0").csr(t), func(context.Context, string) (Admitted, bool, error) {
		return Admitted{}, false, errors.New("the API server is away")
	})
	var refused *Refused
	if err == nil || errors.As(err, &refused) {
		t.Fatalf("err = %v, want an error that is not a refusal", err)
	}
}

// Whatever the bytes and the requester, Decide never panics, and approves
// nothing that names an address other than the requester's admitted one.
func FuzzDecide(f *testing.F) {
	f.Add(kubeletRequest("worker-0", "10.42.1.0").csr(f).Spec.Request, "system:node:worker-0")
	f.Add(kubeletRequest("worker-0", "10.42.1.1").csr(f).Spec.Request, "system:node:worker-0")
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nMAA=\n-----END CERTIFICATE REQUEST-----\n"), "system:node:x")
	f.Fuzz(func(t *testing.T, raw []byte, username string) {
		csr := &certv1.CertificateSigningRequest{Spec: certv1.CertificateSigningRequestSpec{
			Request: raw, SignerName: Signer, Username: username, Groups: []string{"system:nodes"},
			Usages: []certv1.KeyUsage{certv1.UsageServerAuth}, ExpirationSeconds: &policyLifetime,
		}}
		if Decide(context.Background(), csr, admittedNodes) != nil {
			return
		}
		block, _ := pem.Decode(raw)
		req, err := x509.ParseCertificateRequest(block.Bytes)
		if err != nil {
			t.Fatalf("approved a request that does not parse: %v", err)
		}
		a, _, _ := admittedNodes(context.Background(), NodeName(csr))
		for _, ip := range req.IPAddresses {
			addr, _ := netip.AddrFromSlice(ip)
			if len(a.Addresses) == 0 || a.Addresses[0] != addr.Unmap() {
				t.Fatalf("approved %s for %s", ip, username)
			}
		}
	})
}

func ptr[T any](v T) *T { return &v }
