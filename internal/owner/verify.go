package owner

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/validator"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/owner/dialer"
)

// VerifyConfig says which node to check and against what.
type VerifyConfig struct {
	// Node is the node's attested-TLS address, HOST:PORT.
	Node         string
	Measurements policy.Policy
	// PlatformCAs certify the nodes' attestation keys.
	PlatformCAs []*x509.Certificate
	// Collateral is the owner's cache of AMD's and Intel's collateral.
	Collateral validator.Collateral
	// TrustAnyAK accepts any attestation key (development only: a
	// software TPM can then impersonate a node).
	TrustAnyAK bool
	// Logger receives the validator's warnings (a warn-only PCR that
	// differs); nil discards them.
	Logger *slog.Logger
}

// VerifyResult is what a node proved.
type VerifyResult struct {
	Variant variant.Variant
	// Hardware is the node's verified hardware report, for a hardware
	// variant; nil otherwise.
	Hardware []attestation.Field
	// Instance is the VM the platform certified in the attestation
	// key's certificate; zero when the key chained to no platform CA
	// (TrustAnyAK).
	Instance attestation.Instance
}

// Verify has the node attest over a fresh connection and checks the
// attestation. It changes nothing on the node.
func Verify(ctx context.Context, cfg VerifyConfig) (VerifyResult, error) {
	v, err := validator.New(validator.Config{
		Policy: cfg.Measurements, PlatformCAs: cfg.PlatformCAs, Collateral: cfg.Collateral,
		TrustAnyAK: cfg.TrustAnyAK, Logger: orDiscard(cfg.Logger),
	})
	if err != nil {
		return VerifyResult{}, err
	}
	d, err := dialer.New(v)
	if err != nil {
		return VerifyResult{}, err
	}
	conn, err := d.Conn(cfg.Node)
	if err != nil {
		return VerifyResult{}, err
	}
	defer conn.Close()
	var p peer.Peer
	// The attestation is checked while the connection is set up; any
	// answer from the node's gRPC server, even "unimplemented", means it
	// passed.
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
	if err != nil && status.Code(err) != codes.Unimplemented {
		return VerifyResult{}, fmt.Errorf("verify %s: %w", cfg.Node, err)
	}
	info, _ := p.AuthInfo.(atls.AuthInfo)
	return VerifyResult{Variant: info.PeerVariant, Instance: info.PeerInstance, Hardware: info.PeerHardware}, nil
}

func orDiscard(log *slog.Logger) *slog.Logger {
	if log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return log
}
