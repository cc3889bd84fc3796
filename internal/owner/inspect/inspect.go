// Package inspect is the owner's side of the inspect service (inspectpb): it
// reaches running nodes over attested TLS, checks that each runs one of the
// owner's images and is locked to the owner's cluster, proves the owner's
// access key, and reads what the node serves.
package inspect

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/validator"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/owner/dialer"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
	"github.com/orrery-dev/orrery/internal/termtext"
)

// Image is one image the owner accepts: its measurements, named for the
// owner (the file they came from).
type Image struct {
	Name   string
	Policy policy.Policy
}

// Owner is what the owner holds to reach and check running nodes.
type Owner struct {
	// Key is the owner's access key (keys.MasterSecret.OwnerAccessKey).
	Key ed25519.PrivateKey
	// ClusterID is the ID every node of the cluster is locked to: PCR 15
	// must show it.
	ClusterID []byte
	// Images are the images a node may run. At least one.
	Images      []Image
	PlatformCAs []*x509.Certificate
	Collateral  validator.Collateral
	// TrustAnyAK accepts any attestation key (development only).
	TrustAnyAK bool
	// Logger receives the validators' warnings; nil discards them.
	Logger *slog.Logger
}

// Node is a running node that passed the owner's check, reached on its
// inspect service.
type Node struct {
	Attested
	Client inspectpb.InspectServiceClient
	// Status is what the node said of itself on connecting.
	Status *inspectpb.StatusResponse
}

// Dial connects to the inspect service at addr (HOST:PORT), which must
// attest with one of the owner's images and the owner's cluster ID, and
// asks for its status: when Dial returns, the node is verified. If name is
// not empty, the node must also be the one the owner asked for: the
// instance its platform certified in its attestation key's certificate
// must be name. The address of a node comes from its Node object, which
// its own kubelet may rewrite to lead to another, genuine node; only the
// attestation says which node answered.
func (o Owner) Dial(ctx context.Context, addr, name string) (*Node, error) {
	var status *inspectpb.StatusResponse
	a, err := o.DialService(ctx, addr, name, "inspect service", func(ctx context.Context, conn *grpc.ClientConn, p *peer.Peer) error {
		var err error
		status, err = inspectpb.NewInspectServiceClient(conn).Status(ctx, &inspectpb.StatusRequest{}, grpc.Peer(p))
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Node{Attested: *a, Client: inspectpb.NewInspectServiceClient(a.Conn), Status: status}, nil
}

// Attested is a connection to one of the owner's services on a node that
// passed the owner's check.
type Attested struct {
	Addr string
	Conn *grpc.ClientConn
	// Image names the Image whose measurements the node matched.
	Image string
	// Locked means PCR 15 holds the owner's cluster ID; otherwise it is
	// zero: the node waits in its initrd for its disk key.
	Locked   bool
	Variant  variant.Variant
	Instance attestation.Instance
	Hardware []attestation.Field
}

// Close closes the connection.
func (a *Attested) Close() error { return a.Conn.Close() }

// DialService connects to a service of the owner's at addr (HOST:PORT),
// named service in errors, as Dial does: first makes the connection's
// first call, with p to be filled in by grpc.Peer, and the node is
// verified once it returns.
func (o Owner) DialService(ctx context.Context, addr, name, service string, first func(ctx context.Context, conn *grpc.ClientConn, p *peer.Peer) error) (*Attested, error) {
	vs, err := o.validators()
	if err != nil {
		return nil, err
	}
	d, err := dialer.NewAs(o.Key, asValidators(vs)...)
	if err != nil {
		return nil, err
	}
	conn, err := d.Conn(addr)
	if err != nil {
		return nil, err
	}
	a := &Attested{Addr: addr, Conn: conn}
	var p peer.Peer
	if err := first(ctx, conn, &p); err != nil {
		conn.Close()
		if herr := d.HandshakeError(addr, err); herr != err { //nolint:errorlint // identity: did HandshakeError put another error in its place
			return nil, herr
		}
		return nil, fmt.Errorf("%s at %s: %w", service, addr, termtext.Error(err))
	}
	info, _ := p.AuthInfo.(atls.AuthInfo)
	a.Variant, a.Instance, a.Hardware = info.PeerVariant, info.PeerInstance, info.PeerHardware
	if err := checkIdentity(addr, name, a.Instance); err != nil {
		conn.Close()
		return nil, err
	}
	for _, v := range vs {
		if m, locked := v.result(); m != "" {
			a.Image, a.Locked = m, locked
		}
	}
	for _, v := range vs {
		v.pin(a.Instance, a.Locked)
	}
	return a, nil
}

// WrongNodeError means the node that answered at an address is not the
// node the owner asked for.
type WrongNodeError struct {
	Addr, Want string
	// Got is the instance the node's attestation proved; zero if it
	// proved none.
	Got attestation.Instance
}

func (e *WrongNodeError) Error() string {
	if e.Got.IsZero() {
		return fmt.Sprintf("the node at %s proved no instance name (its attestation key's certificate names none, or --insecure-trust-any-ak accepted any key), so it cannot be told from another node: "+
			"it was not taken for %s; name the node by its address to read it anyway", e.Addr, e.Want)
	}
	return fmt.Sprintf("the node at %s is %s, not %s: the address listed for %s leads to another node "+
		"(a node's kubelet may rewrite its own Node's addresses: treat %s as compromised until you know why, and compare 'kubectl get node %s -o wide' with your cloud's record of the VM)",
		e.Addr, e.Got, e.Want, e.Want, e.Want, e.Want)
}

// checkIdentity checks that the instance a node proved is the one named
// (any, if name is empty).
func checkIdentity(addr, name string, got attestation.Instance) error {
	if name == "" || got.Name == name {
		return nil
	}
	return &WrongNodeError{Addr: addr, Want: name, Got: got}
}

// validators makes, per attestation variant among the images, one
// validator that accepts any of that variant's images with PCR 15 locked
// to the owner's cluster.
func (o Owner) validators() ([]*anyImage, error) {
	if len(o.Images) == 0 {
		return nil, errors.New("no image's measurements to check the nodes against")
	}
	if len(o.ClusterID) == 0 {
		return nil, errors.New("no cluster ID to check the nodes' lock against")
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	byVariant := map[variant.Variant]*anyImage{}
	var out []*anyImage
	for _, img := range o.Images {
		withPCR15 := func(v []byte) (attestation.ProofValidator, error) {
			p := img.Policy.Copy()
			p.PCRs[nodelock.PCR] = measurements.Measurement{Expected: v}
			return validator.New(validator.Config{
				Policy: p, PlatformCAs: o.PlatformCAs, Collateral: o.Collateral, TrustAnyAK: o.TrustAnyAK, Logger: log,
			})
		}
		locked, err := withPCR15(nodelock.Expected(o.ClusterID))
		if err != nil {
			return nil, fmt.Errorf("measurements %s: %w", img.Name, err)
		}
		unlocked, err := withPCR15(make([]byte, 32))
		if err != nil {
			return nil, fmt.Errorf("measurements %s: %w", img.Name, err)
		}
		a := byVariant[locked.Variant()]
		if a == nil {
			a = &anyImage{}
			byVariant[locked.Variant()] = a
			out = append(out, a)
		}
		a.cs = append(a.cs, candidate{name: img.Name, locked: locked, unlocked: unlocked})
	}
	return out, nil
}

func asValidators(as []*anyImage) []attestation.Validator {
	vs := make([]attestation.Validator, len(as))
	for i, a := range as {
		vs[i] = a
	}
	return vs
}
