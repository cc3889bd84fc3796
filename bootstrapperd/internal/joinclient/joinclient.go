// Package joinclient is bootstrapperd's way into an existing cluster: it
// finds the control planes through the metadata service, asks their join
// service for a ticket over attested TLS, takes the node lock for the
// cluster the ticket names, re-keys the state disk and runs kubeadm join.
// It keeps trying, with backoff, until a ticket comes or the node is
// initialised by its owner instead.
//
// Both sides attest, and the node sends nothing until the join service
// proved that it is a control plane of this node's image (package
// joinconn says what that proves and what not). A rejoin (the initrd's)
// also knows its cluster: the key it is given must open its disk.
// Besides, a join service's answer does not show the control-plane role:
// a worker is locked to its cluster too, so a privileged pod on a worker
// (which only the cluster's admin can run) could quote there and pass.
package joinclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
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
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm"
	"github.com/orrery-dev/orrery/internal/atomicfile"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/nodeattest"
	"github.com/orrery-dev/orrery/internal/clustersettings"
	"github.com/orrery-dev/orrery/internal/disk/handoff"
	"github.com/orrery-dev/orrery/internal/joinconn"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/pendingjoin"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/records/controlplanes"
	"github.com/orrery-dev/orrery/internal/role"
	"github.com/orrery-dev/orrery/internal/tpm/tpmdev"
	"github.com/orrery-dev/orrery/internal/versions"
)

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
	Join(ctx context.Context, p kubeadm.JoinParams, out io.Writer) error
	// Reset undoes what a failed kubeadm join left behind, so that the
	// next attempt starts clean.
	Reset(ctx context.Context, out io.Writer) error
}

// Config wires the client.
type Config struct {
	Metadata metadata.Source
	// Issuer attests this node to the join service. Required.
	Issuer attestation.Issuer
	// OpenTPM opens this node's TPM; the client reads its own PCRs 4, 9
	// and 11 from it, which the join service must show too. Required.
	OpenTPM tpmdev.Opener
	// PlatformCAs certify the attestation keys of genuine nodes: on a
	// node, the CA that certified its own (qemu.ReadPlatformCA).
	// Required.
	PlatformCAs []*x509.Certificate
	// Peer is what the join service's hardware evidence must show (see
	// joinconn.Config.Peer): nodeattest.Platform.PeerPolicy. The zero
	// value suits a qemu-vtpm node only.
	Peer   nodeattest.PeerPolicy
	Lock   Locker
	Disk   StateDisk
	Joiner Joiner
	// StateDir keeps what a later rejoin needs (the measurement salt).
	StateDir string
	// ClusterVersionFile is where the initrd left the Kubernetes version
	// its rejoin ticket named this boot (handoff.ClusterVersionFile); ""
	// or a missing file: none. Finish runs that version rather than the
	// kept ticket's: the cluster may have moved on since.
	ClusterVersionFile string
	// RecordOwner keeps the public half of the owner's access key from
	// the ticket, for the inspect service. Nil keeps none.
	RecordOwner func(ctx context.Context, key ed25519.PublicKey) error
	// KubeletPKIDir receives the node's client certificate from the join
	// ticket (NodeClientCertFile); its key stays in memory.
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
	// dialNet opens the TCP connection to a join service; nil dials it.
	// Tests route addresses to servers of their own, as an attacker on
	// the network could.
	dialNet func(ctx context.Context, addr string) (net.Conn, error)
	// cmdline returns the kernel command line; nil reads /proc/cmdline.
	cmdline func() ([]byte, error)
}

// ErrLockLost means another path (init) took the node lock first.
var ErrLockLost = errors.New("the node was locked to a cluster by someone else (initialised by its owner)")

// Run tries to join until it succeeds, the lock is lost, or ctx ends.
func Run(ctx context.Context, cfg Config) error {
	cfg, log, status := cfg.withDefaults()
	service, err := joinconn.New(joinconn.Config{
		Issuer: cfg.Issuer, OpenTPM: cfg.OpenTPM, PlatformCAs: cfg.PlatformCAs, Peer: cfg.Peer, Logger: log, DialNet: cfg.dialNet, Cmdline: cfg.cmdline,
	})
	if err != nil {
		return fmt.Errorf("join client: %w", err)
	}
	err = retry(ctx, cfg, log, "no join ticket yet; retrying", func() error { return joinOnce(ctx, cfg, service, log, status) })
	if errors.Is(err, errFailedAfterLock) {
		// The join service gives tickets only to unlocked nodes (PCR 15
		// zero): asking again would be refused forever.
		log.Warn("the join failed after the node lock; retrying it with the ticket kept on the state disk", "phase", "join", "reason", err.Error())
		return Finish(ctx, cfg)
	}
	return err
}

// errFailedAfterLock means that a join failed after its point of no
// return: the node is locked to the cluster and keeps the ticket (see
// pendingjoin), which Finish uses.
var errFailedAfterLock = errors.New("the join failed after the node lock")

func (cfg Config) withDefaults() (Config, *slog.Logger, func(string)) {
	if cfg.Retry == 0 {
		cfg.Retry = 2 * time.Second
	}
	if cfg.MaxRetry == 0 {
		cfg.MaxRetry = 15 * time.Second
	}
	if cfg.after == nil {
		cfg.after = time.After
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	status := cfg.Status
	if status == nil {
		status = func(string) {}
	}
	return cfg, log.With("component", "joinclient"), status
}

// retry runs attempt until it succeeds, the lock is lost, or ctx ends.
// It logs msg with the reason of a failure the first time, whenever the
// reason changes (an operator must see a join service that was down
// come back and refuse, without waiting for the tenth attempt), and
// every tenth attempt.
// Backoff caps low: a node waiting for its cluster's join service should
// join soon after it appears, and a control plane answers one short
// request per node every MaxRetry at most.
func retry(ctx context.Context, cfg Config, log *slog.Logger, msg string, attempt func() error) error {
	pause := cfg.Retry
	last := ""
	for n := 1; ; n++ {
		err := attempt()
		if err == nil || errors.Is(err, ErrLockLost) || errors.Is(err, errFailedAfterLock) {
			return err
		}
		if why := err.Error(); n == 1 || why != last || n%10 == 0 {
			log.Info(msg, "phase", "join", "attempt", n, "retryIn", pause, "reason", why)
			last = why
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-cfg.after(pause):
		}
		pause = min(2*pause, cfg.MaxRetry)
	}
}

func joinOnce(ctx context.Context, cfg Config, service *joinconn.Dialer, log *slog.Logger, status func(string)) error {
	self, services, err := metadata.JoinServices(ctx, cfg.Metadata, joinpb.Port)
	if err != nil {
		return err
	}
	uuid, err := cfg.Disk.UUID(ctx)
	if err != nil {
		return err
	}
	key, csr, err := kubeletCSR(self)
	if err != nil {
		return err
	}
	// Every join service's answer: the one that refused this node says
	// why, whichever was asked last.
	var errs []error
	for _, s := range services {
		addr := s.Addr.String()
		status("joining via " + s.Name + " (" + s.Addr.Addr().String() + ")")
		ticket, err := requestTicket(ctx, service, addr, &joinpb.IssueJoinTicketRequest{
			DiskUuid: uuid, CertificateRequest: csr, IsControlPlane: self.Role == role.ControlPlane,
			// The address kubeadm gives kubelet as its node IP: the one
			// its serving certificate may name.
			NodeAddresses: []string{self.IP.String()},
		})
		var refused *joinconn.RefusedError
		if errors.As(err, &refused) {
			// Every time: an operator must see that something answers
			// in a control plane's place, or runs another image.
			log.Warn("refused a join service: it did not prove that it is a control plane of this node's image; nothing it sent is used",
				"phase", "join", "peer", addr, "reason", refused.Err.Error())
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			continue
		}
		log.Info("got a join ticket", "phase", "join", "peer", addr)
		err = apply(ctx, cfg, log, status, self, key, ticket)
		if err != nil && pendingjoin.Exists(cfg.StateDir) {
			return fmt.Errorf("%w: %w", errFailedAfterLock, err)
		}
		return err
	}
	if len(errs) == 0 {
		return errors.New("no other control-plane node is known")
	}
	return errors.Join(errs...)
}

// requestTicket asks the join service at addr for a ticket.
func requestTicket(ctx context.Context, service *joinconn.Dialer, addr string, req *joinpb.IssueJoinTicketRequest) (*joinpb.IssueJoinTicketResponse, error) {
	var ticket *joinpb.IssueJoinTicketResponse
	err := service.Call(ctx, addr, func(ctx context.Context, c joinpb.JoinServiceClient, opt grpc.CallOption) error {
		var err error
		ticket, err = c.IssueJoinTicket(ctx, req, opt)
		return err
	})
	if err != nil {
		return nil, err
	}
	return ticket, nil
}

func apply(ctx context.Context, cfg Config, log *slog.Logger, status func(string), self metadata.Instance, key []byte, t *joinpb.IssueJoinTicketResponse) error {
	clusterID, err := keys.ClusterID(t.GetMeasurementSecret(), t.GetMeasurementSalt())
	if err != nil {
		return fmt.Errorf("join ticket: %w", err)
	}
	// Check the whole ticket before the point of no return.
	if err := checkVersion(t.GetKubernetesVersion()); err != nil {
		return err
	}
	if k := t.GetOwnerAccessKey(); len(k) != 0 && len(k) != ed25519.PublicKeySize {
		return fmt.Errorf("join ticket: the owner's access key has %d bytes, want %d", len(k), ed25519.PublicKeySize)
	}
	for _, f := range t.GetControlPlaneFiles() {
		// Only kubeadm's shared set: a ticket cannot place, say, an
		// API server certificate of its choosing, or a file elsewhere.
		if !slices.Contains(controlplanes.PKIFiles, f.GetName()) {
			return fmt.Errorf("join ticket names a file that is not one of the control-plane files %v: %q", controlplanes.PKIFiles, f.GetName())
		}
	}
	if err := pendingjoin.Save(cfg.StateDir, t, key); err != nil {
		return err
	}
	locked, err := cfg.Lock.TryLock(clusterID)
	if err != nil {
		return errors.Join(fmt.Errorf("take the node lock: %w", err), pendingjoin.Remove(cfg.StateDir))
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
			return errors.Join(ErrLockLost, pendingjoin.Remove(cfg.StateDir))
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
	if err := handoff.WriteMeasurementSalt(filepath.Join(cfg.StateDir, handoff.MeasurementSaltName), t.GetMeasurementSalt()); err != nil {
		return err
	}
	if err := recordOwner(ctx, cfg, log, t.GetOwnerAccessKey()); err != nil {
		return err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: t.GetKubeletCert()})
	if err := writeFile(filepath.Join(cfg.KubeletPKIDir, NodeClientCertFile), certPEM, 0o644); err != nil {
		return err
	}
	for _, f := range t.GetControlPlaneFiles() {
		if err := writeFile(filepath.Join(cfg.PKIDir, f.GetName()), f.GetData(), 0o600); err != nil {
			return err
		}
	}
	log.Info("running kubeadm join", "phase", "kubeadm-join", "endpoint", t.GetApiServerEndpoint())
	status("running kubeadm join against " + t.GetApiServerEndpoint())
	if err := cfg.Joiner.Join(ctx, kubeadm.JoinParams{
		NodeName: self.Name, NodeIP: self.IP, Endpoint: t.GetApiServerEndpoint(),
		CACert: t.GetClusterCaCert(), ClientCert: t.GetKubeletCert(), ClientKey: key,
		ControlPlane: self.Role == role.ControlPlane, KubernetesVersion: t.GetKubernetesVersion(),
	}, os.Stderr); err != nil {
		return err
	}
	return pendingjoin.Remove(cfg.StateDir)
}

// checkVersion refuses a ticket for a Kubernetes version this node's
// image does not carry: the node runs the cluster's release or none, so
// it never joins with a kubelet the skew policy forbids. The join is
// retried, and the message repeated, until the cluster runs a release
// the image carries: a node of an image of newer Kubernetes waits for
// the owner's upgrade.
func checkVersion(v string) error {
	if _, err := versions.Get(v); err != nil {
		return fmt.Errorf("the cluster runs Kubernetes %s, which this node's image does not carry (it carries %s): "+
			"the node waits until the cluster runs one of those ('orrery upgrade apply --kubernetes-version'), or boot it from an image that carries %s",
			clustersettings.Quote(v), strings.Join(versions.List(), ", "), clustersettings.Quote(v))
	}
	return nil
}

// recordOwner keeps the owner's access key of the ticket for the node
// service. A join service older than the key leaves it out: the node
// joins, and only the owner's inspection of it is refused.
func recordOwner(ctx context.Context, cfg Config, log *slog.Logger, key []byte) error {
	if cfg.RecordOwner == nil {
		return nil
	}
	if len(key) == 0 {
		log.Warn("the join ticket carries no owner access key (the join service predates it): the inspect service will refuse everyone until the node joins again", "phase", "owner-key")
		return nil
	}
	if err := cfg.RecordOwner(ctx, key); err != nil {
		return fmt.Errorf("record the owner's access key: %w", err)
	}
	return nil
}

// Where the node keeps the client certificate of its join ticket, in
// Config.KubeletPKIDir.
//
// The join service signs a client certificate for the node's attested
// name (system:node:<name>, system:nodes), never a serving certificate.
// It used to sign the kubelet's serving certificate, with the names and
// addresses this node asked for, and the node installed it as kubelet.crt:
// a certificate of the cluster CA, which pods trust for the API server,
// for whatever names a node chose. Now nothing is written there: the
// kubelet asks the cluster for its serving certificate (kubeadm's
// KubeletConfiguration sets serverTLSBootstrap), which the join
// service's approver grants for the node's name and the addresses this
// join stated only, and the API server checks it
// (--kubelet-certificate-authority).
//
// kubelet bootstraps with the client certificate (kubeadm's discovery
// kubeconfig holds it too): it asks the cluster for its own certificate
// as system:node:<name>, which the cluster approves for that name only.
// The copy here says which certificate the join service issued. Its key
// is not kept: it reaches kubeadm only inside the discovery kubeconfig,
// which is removed after the join, and once kubelet holds a certificate
// of its own the join service's one would only be a second credential
// for the node lying on disk.
const NodeClientCertFile = "orrery-node-client.crt"

// kubeletCSR makes the node's client key and a CSR for it. The CSR asks
// for the node's identity and nothing else; the join service takes only
// the public key from it, and refuses it if it names another node than
// the one the node's attestation certifies.
func kubeletCSR(self metadata.Instance) (keyPEM, csrDER []byte, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	csrDER, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + self.Name, Organization: []string{"system:nodes"}},
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

// writeFile writes a file of the ticket's through atomicfile: a control
// plane's cluster keys are read on every later boot and a retried join
// rewrites them, so a crash must leave the old file or the new, never a
// torn one.
func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := atomicfile.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
