package joinclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/grpc/credentials"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
)

// ImagePCRs are the PCRs in which the join service must equal this node:
// the kernel and initrd the firmware loaded (4, 9) and the UKI with the
// initrd's phase markers (11), whose command line carries the verity root
// hash. Equal values mean the same image, booted the same way.
var ImagePCRs = []uint32{4, 9, 11}

// LockPCR is the node lock's PCR. A control plane is locked to its
// cluster, so the join service's must not be zero.
const LockPCR = 15

// ServiceRefusedError means the join service at Addr did not prove that
// it is a control plane of this node's image; nothing it sent was used.
type ServiceRefusedError struct {
	Addr string
	// Err is why: the attestation's check (naming a PCR that differs, or
	// the attestation key's certificate), or that it did not attest.
	Err error
}

func (e *ServiceRefusedError) Error() string {
	return fmt.Sprintf("refused the join service at %s, and used nothing it sent: it did not prove that it is a control plane running this node's image "+
		"(attestation key certified by this node's platform CA, PCRs %v equal to this node's own, PCR %d set by the node lock): %v; "+
		"the join client tries the other control planes and retries. If this lasts, check that the control planes run this image "+
		"and that nothing else answers on their port %d", e.Addr, ImagePCRs, LockPCR, e.Err, joinpb.Port)
}

func (e *ServiceRefusedError) Unwrap() error { return e.Err }

// serviceValidator checks the join service's attestation: an attestation
// key that chains to cfg.PlatformCAs, PCRs ImagePCRs equal to this node's
// own current values, and LockPCR not zero (with everything else
// vtpm.Validator checks: nonce and TLS key binding, quote form, log
// replay). See the package comment for what this proves and what not.
func serviceValidator(cfg Config, log *slog.Logger) (attestation.Validator, error) {
	if cfg.Issuer == nil || cfg.OpenTPM == nil {
		return nil, errors.New("join client: Issuer and OpenTPM are required")
	}
	if len(cfg.PlatformCAs) == 0 {
		return nil, errors.New("join client: no platform CA to check the join service's attestation key against; the client would accept a ticket from anyone")
	}
	own, err := ownPCRs(cfg)
	if err != nil {
		return nil, err
	}
	m := measurements.M{}
	for _, pcr := range ImagePCRs {
		m[pcr] = measurements.Measurement{Expected: own[pcr]}
	}
	v, err := qemu.NewValidator(qemu.ValidatorConfig{
		Measurements: m, PlatformCAs: cfg.PlatformCAs, NonZero: []uint32{LockPCR},
		Logger: log.With("check", "join service attestation"),
	})
	if err != nil {
		return nil, fmt.Errorf("join client: %w", err)
	}
	return v, nil
}

// ownPCRs reads this node's SHA-256 values of ImagePCRs from its TPM. They
// cannot change from outside: the network reaches neither the TPM nor the
// boot chain that extended them.
func ownPCRs(cfg Config) (map[uint32][]byte, error) {
	rw, err := cfg.OpenTPM()
	if err != nil {
		return nil, fmt.Errorf("join client: open this node's TPM to read its own PCRs: %w", err)
	}
	defer rw.Close()
	sel := tpm2.PCRSelection{Hash: tpm2.AlgSHA256}
	for _, pcr := range ImagePCRs {
		sel.PCRs = append(sel.PCRs, int(pcr))
	}
	got, err := client.ReadPCRs(rw, sel)
	if err != nil {
		return nil, fmt.Errorf("join client: read this node's PCRs %v: %w", ImagePCRs, err)
	}
	out := map[uint32][]byte{}
	for _, pcr := range ImagePCRs {
		v := got.GetPcrs()[pcr]
		if len(v) != measurements.DigestSize {
			return nil, fmt.Errorf("join client: this node's TPM returned no SHA-256 value for PCR %d", pcr)
		}
		out[pcr] = v
	}
	return out, nil
}

// handshakes wraps the attested-TLS credentials of one request and keeps
// the last failed handshake's error: gRPC reports it only as text inside
// an Unavailable status, and the client must tell a refused service from
// one that is down.
type handshakes struct {
	credentials.TransportCredentials
	mu  sync.Mutex
	err error
}

func (h *handshakes) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := h.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil && provedNothing(err) {
		h.mu.Lock()
		h.err = err
		h.mu.Unlock()
	}
	return conn, info, err
}

// Clone keeps one record for the connection gRPC makes from a clone.
func (h *handshakes) Clone() credentials.TransportCredentials { return h }

func (h *handshakes) failure() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// provedNothing tells a handshake in which the service failed to prove
// itself (its attestation rejected, or none given) from one the network
// cut short, which is an ordinary retry.
func provedNothing(err error) bool {
	var rejected *atls.RejectedError
	var ended *atls.ServerEndedError
	return errors.As(err, &rejected) || errors.As(err, &ended)
}
