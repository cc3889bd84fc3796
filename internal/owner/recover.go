package owner

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/validator"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/owner/dialer"
	"github.com/orrery-dev/orrery/internal/proto/recoverpb"
	"github.com/orrery-dev/orrery/internal/termtext"
)

// RecoverConfig is what Recover needs.
type RecoverConfig struct {
	// Node is the recovery server's address on the node, HOST:PORT.
	Node string
	// Measurements are the image's: a node waiting in its initrd shows
	// them, PCR 15 still zero.
	Measurements policy.Policy
	PlatformCA   *x509.Certificate
	// Collateral is the owner's cache of AMD's and Intel's collateral.
	Collateral validator.Collateral
	// MasterSecret is the cluster's, as 'orrery init' saved it.
	MasterSecret keys.MasterSecret
	// ControlPlane is the instance the owner's records name as the
	// cluster's control plane (the workspace's first node): the node
	// that answers must be it, proved by its platform-certified
	// attestation key, before it gets the master secret and the
	// control plane's role. The zero Instance (the first node was
	// removed) leaves ControlPlaneIDs alone.
	ControlPlane attestation.Instance
	// ControlPlaneIDs are the instance IDs of the other control planes
	// the owner approved (the workspace's record): a node certified as one
	// of them is accepted too.
	ControlPlaneIDs []string
	// CACert (DER) and Endpoint (host:port) are the cluster's, from the
	// owner's admin kubeconfig: the node checks the files its disk keeps
	// against them, with a control plane's latitude.
	CACert   []byte
	Endpoint string
	Logger   *slog.Logger
	Progress Progress
}

// ErrNotTheControlPlane means the node that answered is not the control
// plane the owner's records name; it got nothing.
var ErrNotTheControlPlane = errors.New("the node is not the control plane your workspace records")

// ErrWrongMasterSecret means the node refused the master secret: it does
// not open the node's state disk. The node is unchanged and keeps waiting.
var ErrWrongMasterSecret = errors.New("the node refused the master secret: it does not open the node's state disk")

// Recover hands the master secret to a node that waits in its initrd for
// its state disk's key (every control plane was down when it booted),
// after the node proved that it runs the image. The node derives its key,
// opens its disk and boots on; Recover returns once the node said so.
func Recover(ctx context.Context, cfg RecoverConfig) error {
	r := newReporter(cfg.Progress)
	if err := cfg.MasterSecret.Validate(); err != nil {
		return fmt.Errorf("master secret: %w", err)
	}
	if (cfg.ControlPlane.Name == "" || cfg.ControlPlane.ID == "") && len(cfg.ControlPlaneIDs) == 0 {
		return errors.New("no record of the cluster's control planes (their instances): recover needs the state file 'orrery init' wrote beside the master secret, and 'orrery control-plane approve' to have recorded the others there if the first was removed")
	}
	if len(cfg.CACert) == 0 || cfg.Endpoint == "" {
		return errors.New("no cluster CA certificate or API server endpoint: recover needs the admin kubeconfig 'orrery init' wrote beside the master secret")
	}
	v, err := validator.New(validator.Config{
		Policy: cfg.Measurements, PlatformCAs: []*x509.Certificate{cfg.PlatformCA}, Collateral: cfg.Collateral, Logger: orDiscard(cfg.Logger),
	})
	if err != nil {
		return err
	}
	d, err := dialer.New(onlyInstance{v, cfg.ControlPlane, cfg.ControlPlaneIDs})
	if err != nil {
		return err
	}
	// The initrd serves recovery only once its network is up and it has
	// read its platform and role from the metadata service, which under
	// load takes longer than a socket systemd opens: a refused port is
	// waited for as long as the command's context allows.
	d.RefusedGrace = 0
	start := time.Now()
	r.notice(fmt.Sprintf("Recovering %s", cfg.Node))
	err = d.WaitAttested(ctx, cfg.Node, func(attempt int, err error) error {
		if attempt == 1 {
			r.detail(fmt.Sprintf("waiting for %s to serve recovery (a control plane that found no join service serves it from its initrd): %v", cfg.Node, err))
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.step("attested; sending the master secret")
	conn, err := d.Conn(cfg.Node)
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = recoverpb.NewRecoverServiceClient(conn).Recover(ctx, &recoverpb.RecoverRequest{
		MasterSecret: cfg.MasterSecret.Key, MasterSecretSalt: cfg.MasterSecret.Salt,
		ClusterCaCert: cfg.CACert, ApiServerEndpoint: cfg.Endpoint,
	})
	switch status.Code(err) {
	case codes.OK:
		r.notice(fmt.Sprintf("%s opened its state disk and boots on (%s)", cfg.Node, time.Since(start).Round(time.Second)))
		return nil
	case codes.AlreadyExists:
		r.notice(fmt.Sprintf("%s needs no recovery: %s", cfg.Node, termtext.Line(status.Convert(err).Message())))
		return nil
	case codes.PermissionDenied:
		return fmt.Errorf("%w (%s)", ErrWrongMasterSecret, termtext.Line(status.Convert(err).Message()))
	}
	return fmt.Errorf("recover %s: %w", cfg.Node, termtext.Error(err))
}

// onlyInstance accepts, in the TLS handshake, only a node whose
// certified instance is want: the master secret goes to no other, and
// the host's metadata, which decides which nodes serve recovery, cannot
// make a worker the control plane.
type onlyInstance struct {
	attestation.ProofValidator
	want attestation.Instance
	// others are further instance IDs that may answer.
	others []string
}

func (o onlyInstance) Validate(ctx context.Context, doc, nonce []byte) ([]byte, error) {
	p, err := o.ValidateProof(ctx, doc, nonce)
	return p.UserData, err
}

func (o onlyInstance) ValidateProof(ctx context.Context, doc, nonce []byte) (attestation.Proof, error) {
	p, err := o.ProofValidator.ValidateProof(ctx, doc, nonce)
	if err != nil {
		return attestation.Proof{}, err
	}
	if (o.want.IsZero() || p.Instance != o.want) && (p.Instance.IsZero() || !slices.Contains(o.others, p.Instance.ID)) {
		return attestation.Proof{}, fmt.Errorf("%w: it is %s, and your workspace records %s and %d approved control planes; recover hands the master secret to those alone",
			ErrNotTheControlPlane, p.Instance, o.want, len(o.others))
	}
	return p, nil
}
