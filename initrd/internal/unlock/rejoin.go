package unlock

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/clustersettings"
	"github.com/orrery-dev/orrery/internal/joinconn"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/versions"
)

// JoinService calls join services that proved themselves (a
// *joinconn.Dialer).
type JoinService interface {
	Call(ctx context.Context, addr string, call func(ctx context.Context, c joinpb.JoinServiceClient, opt grpc.CallOption) error) error
}

// Rejoiner asks the cluster's join services for the state disk's key,
// which comes with what the join service says of the cluster
// (Key.Cluster).
type Rejoiner struct {
	Metadata    metadata.Source
	JoinService JoinService
	// DiskUUID is the state disk's LUKS UUID.
	DiskUUID string
	Unlocker *Unlocker
	// Say writes a line on the console.
	Say func(format string, args ...any)
	// Retry is the first pause between rounds; it doubles after each
	// round up to MaxRetry. Zero means 2 s and 15 s.
	Retry, MaxRetry time.Duration
}

// Run asks every control plane but this node, round after round, until
// the disk is open (by a ticket or by the owner) or ctx ends. It says on
// the console why a round failed: the first time, whenever the reason
// changes, and every tenth round. A disk the Unlocker refuses
// (ErrRefused) ends it at once: no join service is asked for its key.
func (r *Rejoiner) Run(ctx context.Context) error {
	pause, maxPause := r.Retry, r.MaxRetry
	if pause == 0 {
		pause = 2 * time.Second
	}
	if maxPause == 0 {
		maxPause = 15 * time.Second
	}
	last := ""
	for round := 1; ; round++ {
		err := r.round(ctx)
		if err == nil || errors.Is(err, ErrOpen) {
			return nil
		}
		if errors.Is(err, ErrRefused) {
			r.Say("not asking the join service for the state disk's key: %v. This boot goes no further: replace the state disk with a blank one to join the node as a new node", err)
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if why := err.Error(); why != last || round%10 == 0 {
			r.Say("no key from the join service yet (round %d, next in %s): %s", round, pause, why)
			last = why
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.Unlocker.Opened():
			return nil
		case <-time.After(pause):
		}
		pause = min(2*pause, maxPause)
	}
}

// round asks each control plane once, if the disk can take a key.
func (r *Rejoiner) round(ctx context.Context) error {
	if err := r.Unlocker.Check(ctx); err != nil {
		return err
	}
	_, services, err := metadata.JoinServices(ctx, r.Metadata, joinpb.Port)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range services {
		addr := s.Addr.String()
		err := r.ask(ctx, addr)
		if err == nil || errors.Is(err, ErrOpen) || errors.Is(err, ErrRefused) {
			return err
		}
		errs = append(errs, fmt.Errorf("%s (%s): %w", s.Name, addr, err))
	}
	if len(errs) == 0 {
		return errors.New("the metadata service names no other control plane; with every control plane down, the owner recovers one with 'orrery recover'")
	}
	return errors.Join(errs...)
}

// ask gets a rejoin ticket from the join service at addr, checks what it
// says of the cluster (clusterOf), and tries its key.
func (r *Rejoiner) ask(ctx context.Context, addr string) error {
	var t *joinpb.IssueRejoinTicketResponse
	err := r.JoinService.Call(ctx, addr, func(ctx context.Context, c joinpb.JoinServiceClient, opt grpc.CallOption) error {
		var err error
		t, err = c.IssueRejoinTicket(ctx, &joinpb.IssueRejoinTicketRequest{DiskUuid: r.DiskUUID}, opt)
		return err
	})
	if err != nil {
		var refused *joinconn.RefusedError
		if errors.As(err, &refused) {
			return refused
		}
		return err
	}
	cluster, err := clusterOf(t)
	if err != nil {
		return fmt.Errorf("refusing its rejoin ticket, whose key is not tried: %w", err)
	}
	err = r.Unlocker.Try(ctx, Key{DiskKey: t.GetStateDiskKey(), MeasurementSecret: t.GetMeasurementSecret(), Cluster: cluster, OwnerAccessKey: t.GetOwnerAccessKey(), From: "the join service at " + addr, JoinService: addr})
	if errors.Is(err, ErrWrongKey) {
		// A service of another cluster of this image, or a cluster that
		// lost its keys: never this disk's key. Said at once, even if
		// another control plane opens the disk in this round: an operator
		// should know that another cluster answers here.
		err := fmt.Errorf("its key does not open this node's state disk (UUID %s), which is untouched: it is not this node's cluster", r.DiskUUID)
		r.Say("the join service at %s gave a key that does not open the state disk; trying the others: %v", addr, err)
		return err
	}
	return err
}

// maxEndpoint is the longest API server endpoint a ticket may carry, in
// bytes.
const maxEndpoint = 255

// clusterOf is what ticket t says of the cluster, checked: the CA must
// be a DER X.509 CA certificate, and the endpoint a host and a numeric
// port with no scheme, of at most maxEndpoint bytes. The initrd checks
// the node's kept files against these, so a ticket that fails is
// refused whole.
func clusterOf(t *joinpb.IssueRejoinTicketResponse) (*Cluster, error) {
	if k := t.GetOwnerAccessKey(); len(k) != 0 && len(k) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("its owner access key has %d bytes, want %d", len(k), ed25519.PublicKeySize)
	}
	c, err := checkedCluster(t.GetClusterCaCert(), t.GetApiServerEndpoint(), t.GetControlPlane())
	if err != nil {
		return nil, err
	}
	// The node runs the cluster's release or none: its image must carry
	// it (a cluster upgraded past this image waits for the node's new
	// image).
	v := t.GetKubernetesVersion()
	if _, err := versions.Get(v); err != nil {
		if v == "" {
			return nil, errors.New("it names no Kubernetes version (a join service older than this image): upgrade the cluster's services ('orrery upgrade apply') before this node rejoins")
		}
		return nil, fmt.Errorf("the cluster runs Kubernetes %s, which this node's image does not carry (it carries %s): boot this node from an image that does", clustersettings.Quote(v), strings.Join(versions.List(), ", "))
	}
	c.KubernetesVersion = v
	return c, nil
}

// checkedCluster is a Cluster of caCert and endpoint once both are
// checked: the CA must be a DER X.509 CA certificate, and the endpoint a
// host and a numeric port with no scheme, of at most maxEndpoint bytes.
func checkedCluster(caCert []byte, endpoint string, controlPlane bool) (*Cluster, error) {
	ca, err := x509.ParseCertificate(caCert)
	if err != nil {
		return nil, fmt.Errorf("its cluster CA certificate (%d bytes) is not a DER X.509 certificate: %w", len(caCert), err)
	}
	if !ca.IsCA {
		return nil, fmt.Errorf("its cluster CA certificate (subject %q) is not a CA certificate", ca.Subject.String())
	}
	if err := checkEndpoint(endpoint); err != nil {
		return nil, fmt.Errorf("its API server endpoint: %w", err)
	}
	return &Cluster{CACert: caCert, Endpoint: endpoint, ControlPlane: controlPlane}, nil
}

// checkEndpoint checks that e is host:port, as net.SplitHostPort reads
// it (an IPv6 host in brackets), with a host, a port from 1 to 65535 and
// no scheme.
func checkEndpoint(e string) error {
	if len(e) > maxEndpoint {
		return fmt.Errorf("%d bytes, more than %d", len(e), maxEndpoint)
	}
	if strings.Contains(e, "://") {
		return fmt.Errorf("%q has a scheme; want host:port", e)
	}
	host, port, err := net.SplitHostPort(e)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", e, err)
	}
	if host == "" {
		return fmt.Errorf("%q names no host", e)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("%q: port %q is not a number from 1 to 65535", e, port)
	}
	return nil
}
