// Package joinclient is bootstrapperd's way into an existing cluster: it
// finds the control planes through the metadata service, asks their join
// service for a ticket over attested TLS (this node attests), takes the
// node lock for the cluster the ticket names, re-keys the state disk and
// runs kubeadm join. It keeps trying, with backoff, until a ticket comes or
// the node is initialised by its owner instead.
package joinclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
)

// Port is the join service's port on control-plane nodes.
const Port = 30090

// Instance is a node as the metadata service describes it.
type Instance struct {
	Name string
	Role string
	IP   netip.Addr
}

// Metadata tells the client who it is and where the control planes are.
type Metadata interface {
	Self(ctx context.Context) (Instance, error)
	Peers(ctx context.Context) ([]Instance, error)
}

// Dialer opens a join service client to addr over attested TLS.
type Dialer func(ctx context.Context, addr string) (joinpb.JoinServiceClient, io.Closer, error)

// Locker is the node lock.
type Locker interface {
	TryLock(clusterID []byte) (bool, error)
	// LockedTo reports whether the node is locked to clusterID already,
	// by an earlier attempt of this join.
	LockedTo(clusterID []byte) (bool, error)
}

// StateDisk is the node's state disk.
type StateDisk interface {
	UUID(ctx context.Context) (string, error)
	Rekey(ctx context.Context, newKey []byte) error
}

// Joiner runs kubeadm join.
type Joiner interface {
	Join(ctx context.Context, p JoinParams, out io.Writer) error
	// Reset undoes what a failed kubeadm join left behind, so that the
	// next attempt starts clean.
	Reset(ctx context.Context, out io.Writer) error
}

// JoinParams are what kubeadm join needs.
type JoinParams struct {
	NodeName     string
	NodeIP       netip.Addr
	Endpoint     string
	Token        string
	CACertHash   string
	ControlPlane bool
}

// Config wires the client.
type Config struct {
	Metadata Metadata
	Dial     Dialer
	Lock     Locker
	Disk     StateDisk
	Joiner   Joiner
	// StateDir keeps what a later rejoin needs (the measurement salt).
	StateDir string
	// KubeletPKIDir receives the kubelet's serving certificate and key.
	KubeletPKIDir string
	// PKIDir receives a control plane's cluster PKI files.
	PKIDir string
	// Retry is the first pause between attempts; it doubles after each
	// failure up to MaxRetry. Zero means 2 s and 15 s.
	Retry, MaxRetry time.Duration
	Logger          *slog.Logger
	// Status reports progress to systemd (STATUS=); nil ignores it.
	Status func(string)

	after func(time.Duration) <-chan time.Time // time.After; tests record the pauses
}

// ErrLockLost means another path (init) took the node lock first.
var ErrLockLost = errors.New("the node was locked to a cluster by someone else (initialised by its owner)")

// Run tries to join until it succeeds, the lock is lost, or ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Retry == 0 {
		cfg.Retry = 2 * time.Second
	}
	if cfg.MaxRetry == 0 {
		cfg.MaxRetry = 15 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	status := cfg.Status
	if status == nil {
		status = func(string) {}
	}
	// Backoff caps low: a node waiting for its cluster's join service
	// should join soon after it appears, and a control plane answers one
	// short request per node every MaxRetry at most.
	pause := cfg.Retry
	after := cfg.after
	if after == nil {
		after = time.After
	}
	for attempt := 1; ; attempt++ {
		err := joinOnce(ctx, cfg, log, status)
		if err == nil || errors.Is(err, ErrLockLost) {
			return err
		}
		if attempt == 1 || attempt%10 == 0 {
			log.Info("no join ticket yet; retrying", "phase", "join", "attempt", attempt, "retryIn", pause, "reason", err.Error())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-after(pause):
		}
		pause = min(2*pause, cfg.MaxRetry)
	}
}

func joinOnce(ctx context.Context, cfg Config, log *slog.Logger, status func(string)) error {
	self, err := cfg.Metadata.Self(ctx)
	if err != nil {
		return fmt.Errorf("ask the metadata service who this node is: %w", err)
	}
	peers, err := cfg.Metadata.Peers(ctx)
	if err != nil {
		return fmt.Errorf("ask the metadata service for the control planes: %w", err)
	}
	uuid, err := cfg.Disk.UUID(ctx)
	if err != nil {
		return err
	}
	key, csr, err := kubeletCSR(self)
	if err != nil {
		return err
	}
	var lastErr error = errors.New("no other control-plane node is known")
	for _, p := range peers {
		if p.Role != "control-plane" || p.IP == self.IP {
			continue
		}
		addr := netip.AddrPortFrom(p.IP, Port).String()
		status("joining via " + p.IP.String())
		ticket, err := requestTicket(ctx, cfg.Dial, addr, &joinpb.IssueJoinTicketRequest{
			DiskUuid: uuid, CertificateRequest: csr, IsControlPlane: self.Role == "control-plane",
		})
		if err != nil {
			lastErr = fmt.Errorf("%s: %w", addr, err)
			continue
		}
		log.Info("got a join ticket", "phase", "join", "peer", addr)
		return apply(ctx, cfg, log, status, self, key, ticket)
	}
	return lastErr
}

func requestTicket(ctx context.Context, dial Dialer, addr string, req *joinpb.IssueJoinTicketRequest) (*joinpb.IssueJoinTicketResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c, closer, err := dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	return c.IssueJoinTicket(ctx, req)
}

// apply uses a ticket: lock, re-key, files, kubeadm join.
func apply(ctx context.Context, cfg Config, log *slog.Logger, status func(string), self Instance, key []byte, t *joinpb.IssueJoinTicketResponse) error {
	clusterID, err := keys.ClusterID(t.GetMeasurementSecret(), t.GetMeasurementSalt())
	if err != nil {
		return fmt.Errorf("join ticket: %w", err)
	}
	// Check the whole ticket before the point of no return.
	for _, f := range t.GetControlPlaneFiles() {
		if !filepath.IsLocal(f.GetName()) {
			return fmt.Errorf("join ticket names a control-plane file outside the PKI directory: %q", f.GetName())
		}
	}
	locked, err := cfg.Lock.TryLock(clusterID)
	if err != nil {
		return fmt.Errorf("take the node lock: %w", err)
	}
	if locked {
		log.Info("node locked to the cluster", "phase", "lock", "clusterID", fmt.Sprintf("%x", clusterID))
	} else {
		// The lock is taken. If an earlier attempt of ours took it for
		// this very cluster and failed later on, finish the job: the node
		// can belong to no other cluster until it reboots anyway.
		mine, err := cfg.Lock.LockedTo(clusterID)
		if err != nil {
			return fmt.Errorf("read the node lock: %w", err)
		}
		if !mine {
			return ErrLockLost
		}
		log.Info("node already locked to this cluster by an earlier attempt; cleaning up and joining again", "phase", "lock", "clusterID", fmt.Sprintf("%x", clusterID))
		status("retrying the join: kubeadm reset")
		if err := cfg.Joiner.Reset(ctx, os.Stderr); err != nil {
			return fmt.Errorf("clean up the failed join (kubeadm reset): %w", err)
		}
	}
	if err := cfg.Disk.Rekey(ctx, t.GetStateDiskKey()); err != nil {
		return fmt.Errorf("re-key the state disk: %w", err)
	}
	if err := writeFile(filepath.Join(cfg.StateDir, "measurement-salt"), t.GetMeasurementSalt(), 0o600); err != nil {
		return err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: t.GetKubeletCert()})
	if err := writeFile(filepath.Join(cfg.KubeletPKIDir, "kubelet.crt"), certPEM, 0o644); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(cfg.KubeletPKIDir, "kubelet.key"), key, 0o600); err != nil {
		return err
	}
	for _, f := range t.GetControlPlaneFiles() {
		if err := writeFile(filepath.Join(cfg.PKIDir, f.GetName()), f.GetData(), 0o600); err != nil {
			return err
		}
	}
	log.Info("running kubeadm join", "phase", "kubeadm-join", "endpoint", t.GetApiServerEndpoint())
	status("running kubeadm join against " + t.GetApiServerEndpoint())
	return cfg.Joiner.Join(ctx, JoinParams{
		NodeName: self.Name, NodeIP: self.IP, Endpoint: t.GetApiServerEndpoint(), Token: t.GetToken(),
		CACertHash: t.GetDiscoveryTokenCaCertHash(), ControlPlane: self.Role == "control-plane",
	}, os.Stderr)
}

// kubeletCSR makes the kubelet's serving key and a CSR for it.
func kubeletCSR(self Instance) (keyPEM, csrDER []byte, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	csrDER, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "system:node:" + self.Name, Organization: []string{"system:nodes"}},
		DNSNames:    []string{self.Name},
		IPAddresses: []net.IP{self.IP.AsSlice()},
	}, k)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), csrDER, nil
}

func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
