// Package joinserver issues join and rejoin tickets to nodes that attested
// over attested TLS: everything a node needs to unlock its state disk and
// run `kubeadm join`. The measurements a node must match are enforced by
// the transport at the handshake (see internal/atls and
// joinservice/internal/setvalidator, which also requires PCR 15 to be
// zero: a node asks before it locks itself to a cluster); this package
// checks the request and assembles the ticket.
//
// A handshake's attestation is checked again before every ticket
// (Config.CurrentSet): a node whose measurement set the owner retired
// since, or whose connection attested too long ago, is refused on that
// connection, and told to upgrade or reconnect.
//
// A ticket holds what the node needs and no more:
//   - Who the node is comes from its attestation: the instance (name and
//     ID) that the platform CA certified in the node's attestation key
//     certificate (atls.AuthInfo.PeerInstance). A request is refused if it
//     names another node, or if the node's certificate names no instance.
//   - The kubelet certificate names that node only (system:node:<name>,
//     group system:nodes), for client authentication only, with no DNS
//     names or addresses.
//   - No bootstrap token: with one, a node could ask the cluster for a
//     client certificate of any node name. The node joins with the
//     kubelet certificate and the cluster CA (kubeadm's file discovery);
//     kubelet renews that certificate for its own name only (the
//     selfnodeclient approval).
//   - Control-plane files (the cluster's CA keys) go only to a node whose
//     instance ID the owner approved as a control plane
//     (Config.ControlPlanes); a node that asks for them otherwise is
//     refused, and the refusal logged. What the node says its role is
//     decides nothing. A rejoin ticket tells the node, from the same
//     list, whether it is a control plane.
//   - A state disk is admitted for one VM (Config.Admissions records it
//     at join): a join with a disk recorded for another VM, and a rejoin
//     for a disk never admitted or admitted for another VM, are refused.
//     Disk UUIDs are not secret; the certified instance is what a node
//     cannot borrow.
//
// A rejoining node then proves that the disk its ticket opened is not an
// older copy of itself (CheckDiskGeneration, RecordDiskGeneration; see
// internal/records/admitted for the protocol): the host can swap a state disk for
// a copy it took earlier, which the same key opens. Both calls pass the
// same checks as a rejoin ticket.
package joinserver

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/proto/keypb"
	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/internal/records/controlplanes"
	"github.com/orrery-dev/orrery/internal/records/removednodes"
	"github.com/orrery-dev/orrery/internal/versions"
	"github.com/orrery-dev/orrery/joinservice/internal/admissions"
)

// KeyClient asks the key service for keys.
type KeyClient interface {
	GetDataKey(ctx context.Context, keyID string, length int) ([]byte, error)
}

// Admissions is the cluster's record of which VM each state disk was
// admitted for (admissions.Store).
type Admissions interface {
	// Admit records rec: its disk for its instance, which attested with
	// its measurement set and stated its addresses;
	// admissions.ErrOtherInstance if the disk is recorded for another
	// VM, admissions.ErrAddressTaken if an address is,
	// admissions.ErrNameTaken if the node's name is.
	Admit(ctx context.Context, rec admitted.Record) error
	// Lookup returns the record of diskUUID (the VM it was admitted
	// for, whether the owner removed that node), if any.
	Lookup(ctx context.Context, diskUUID string) (rec admitted.Record, found bool, err error)
	// Attested records the set the disk's node attested with again.
	Attested(ctx context.Context, diskUUID, set string) error
	// CheckGeneration decides on the generation diskUUID presents at a
	// rejoin and returns, stored, the next one for the node to write; an
	// *admitted.GenerationError for an older copy of the disk.
	CheckGeneration(ctx context.Context, diskUUID string, presented uint64) (next uint64, err error)
	// RecordGeneration records that diskUUID holds g, the generation
	// CheckGeneration issued last (admitted.ErrNotIssued otherwise).
	RecordGeneration(ctx context.Context, diskUUID string, g uint64) error
}

// Nodes tells whether the cluster still has a node: an owner removes a
// node with 'kubectl delete node', and its disk gets no rejoin ticket
// from then on.
type Nodes interface {
	NodeExists(ctx context.Context, name string) (bool, error)
}

// Config wires the server.
type Config struct {
	Keys KeyClient
	// Admissions records admitted disks. Required.
	Admissions Admissions
	// Nodes are the cluster's nodes. Required.
	Nodes Nodes
	// Removed returns the nodes the owner removed (internal/records/removednodes);
	// it is asked on every request, and a listed name or instance gets
	// no ticket. Nil lists none.
	Removed func(ctx context.Context) (removednodes.List, error)
	// CurrentSet names the measurement set a peer's attestation matched,
	// given the TLS key the attestation bound, if that attestation still
	// admits the peer: its set is still accepted and it is recent enough
	// (setvalidator's Validator.Current). It is asked before every
	// ticket; an error refuses the ticket with PermissionDenied and the
	// error's text, which says what to do. Required.
	CurrentSet func(ctx context.Context, peerKey []byte) (set string, err error)
	// CA and CAKey are the cluster CA, which signs kubelet certificates.
	CA    *x509.Certificate
	CAKey crypto.Signer
	// PKIDir holds the control-plane files (/etc/kubernetes/pki).
	PKIDir string
	// Endpoint is the API server endpoint, host:port. No node may state
	// its address, or take its name.
	Endpoint string
	// Reserved returns what is the cluster's own (its Services' and
	// pods' networks, the API server's certificate names), asked for
	// every join: no node may state an address in it or take a name of
	// it. Nil reserves nothing beyond Endpoint.
	Reserved func(ctx context.Context) (Reserved, error)
	// ClusterVersion returns the Kubernetes version the cluster runs now
	// (kubeadm's ClusterConfiguration), asked for every ticket: a node
	// runs that release of its image. An error refuses the ticket
	// (UNAVAILABLE). Required.
	ClusterVersion func(ctx context.Context) (string, error)
	// ControlPlaneVersions returns the Kubernetes version that each
	// control plane's kubelet reports, asked with ClusterVersion: while
	// an upgrade moves them one by one, a ticket names the oldest, so
	// that no node the host reboots then gets a kubelet newer than an API
	// server. Nil means every control plane runs ClusterVersion.
	ControlPlaneVersions func(ctx context.Context) ([]string, error)
	// MeasurementSalt returns the cluster's measurement salt.
	MeasurementSalt func(ctx context.Context) ([]byte, error)
	// ControlPlanes returns the instance IDs the owner approved as
	// control planes (see internal/records/controlplanes); it is asked on every
	// request for control-plane files and on every rejoin (whose ticket
	// says whether the node is one), so an approval needs no restart. Nil
	// approves none: every request for control-plane files is refused,
	// and every rejoin ticket says the node is no control plane.
	ControlPlanes func(ctx context.Context) ([]string, error)
	// Now is the clock; nil means time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Server implements joinpb.JoinServiceServer.
type Server struct {
	joinpb.UnimplementedJoinServiceServer
	cfg Config
	log *slog.Logger
}

// New returns a join server.
func New(cfg Config) (*Server, error) {
	if cfg.Admissions == nil {
		return nil, errors.New("join server: no record of admitted nodes configured (Config.Admissions)")
	}
	if cfg.CA == nil || cfg.CAKey == nil {
		return nil, errors.New("join server: no cluster CA configured (Config.CA, Config.CAKey)")
	}
	if cfg.Nodes == nil {
		return nil, errors.New("join server: no view of the cluster's nodes configured (Config.Nodes)")
	}
	if cfg.CurrentSet == nil {
		return nil, errors.New("join server: no check of the accepted measurement sets configured (Config.CurrentSet)")
	}
	if cfg.ClusterVersion == nil {
		return nil, errors.New("join server: no view of the cluster's Kubernetes version configured (Config.ClusterVersion)")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, log: log.With("component", "joinserver")}, nil
}

// IssueJoinTicket implements joinpb.JoinServiceServer.
func (s *Server) IssueJoinTicket(ctx context.Context, req *joinpb.IssueJoinTicketRequest) (*joinpb.IssueJoinTicketResponse, error) {
	info, err := requireAttested(ctx)
	if err != nil {
		return nil, err
	}
	inst, err := requireInstance(info)
	if err != nil {
		s.log.Warn("refused a join: the node's attestation names no instance", "peer", peerAddr(ctx), "variant", info.PeerVariant.String())
		return nil, err
	}
	log := s.log.With("node", inst.Name, "instanceID", inst.ID, "diskUUID", strings.ToLower(req.GetDiskUuid()), "controlPlane", req.GetIsControlPlane())
	set, err := s.currentSet(ctx, info)
	if err != nil {
		log.Warn("refused a join: the connection's attestation no longer admits the node", "reason", err.Error())
		return nil, err
	}
	keyID, err := keys.DiskKeyID(req.GetDiskUuid())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	// Before the node is admitted: a cluster whose version cannot be read
	// admits no one.
	version, err := s.clusterVersion(ctx, log)
	if err != nil {
		return nil, err
	}
	csr, claimed, err := checkCSR(req.GetCertificateRequest())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "kubelet certificate request: %v", err)
	}
	addrs, err := s.nodeAddresses(ctx, inst, req.GetNodeAddresses())
	if err != nil {
		log.Warn("refused a join: the node's addresses", "reason", err.Error())
		return nil, err
	}
	rec := admitted.Record{DiskUUID: req.GetDiskUuid(), Instance: inst, MeasurementSet: set, Addresses: addrs}
	if err := s.authorizeJoin(ctx, log, req, rec, claimed); err != nil {
		return nil, err
	}
	k, err := s.ticketKeys(ctx, log, keyID)
	if err != nil {
		return nil, err
	}
	salt, err := s.cfg.MeasurementSalt(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read the measurement salt: %v", err)
	}
	cert, err := s.signKubeletCert(inst.Name, csr.PublicKey)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "sign the kubelet certificate: %v", err)
	}
	var files []*joinpb.ControlPlaneFile
	if req.GetIsControlPlane() {
		if files, err = s.controlPlaneFiles(); err != nil {
			log.Error("control-plane files unavailable", "error", err)
			return nil, status.Errorf(codes.Internal, "read control-plane files: %v", err)
		}
	}
	log.Info("issued join ticket", "kubernetesVersion", version)
	return &joinpb.IssueJoinTicketResponse{
		StateDiskKey:         k.disk,
		MeasurementSalt:      salt,
		MeasurementSecret:    k.measurementSecret,
		KubeletCert:          cert,
		ClusterCaCert:        s.cfg.CA.Raw,
		ApiServerEndpoint:    s.cfg.Endpoint,
		ControlPlaneFiles:    files,
		KubernetesVersion:    version,
		KubernetesComponents: components(version),
		OwnerAccessKey:       k.owner,
	}, nil
}

// authorizeJoin decides whether the instance of rec, whose CSR claims
// node name claimed, gets a join ticket for req, and records rec. Every
// refusal is logged.
func (s *Server) authorizeJoin(ctx context.Context, log *slog.Logger, req *joinpb.IssueJoinTicketRequest, rec admitted.Record, claimed string) error {
	inst := rec.Instance
	// Refuse rather than quietly sign for the attested name: a node that
	// asks under another name is either misconfigured (the metadata
	// service told it a name that is not its own, and kubeadm would
	// register it under that name) or attacking, and either way an
	// operator should hear of it.
	if claimed != inst.Name {
		log.Warn("refused a join: the request names another node", "claimedName", claimed)
		return status.Errorf(codes.PermissionDenied,
			"the kubelet certificate request names node %q, but this node's attestation key certificate names it %s: a node joins only under the name its platform certified; check the name the metadata service gives this VM",
			claimed, inst)
	}
	if err := s.refuseRemoved(ctx, log, "join", inst); err != nil {
		return err
	}
	if req.GetIsControlPlane() {
		if err := s.requireApprovedControlPlane(ctx, inst); err != nil {
			log.Warn("refused a join: the node asked for control-plane files and is not an approved control plane", "reason", err.Error())
			return err
		}
	}
	// Recorded before any key is handed out: a node that got its disk
	// key can always rejoin with it, and no other VM can.
	err := s.cfg.Admissions.Admit(ctx, rec)
	switch {
	case errors.Is(err, admissions.ErrAddressTaken):
		log.Warn("refused a join: the node states an address of another node", "reason", err.Error())
		return status.Errorf(codes.PermissionDenied, "%v; a node joins only with addresses of its own (if that node is gone for good, remove it with 'orrery node remove')", err)
	case errors.Is(err, admissions.ErrNameTaken):
		log.Warn("refused a join: another VM is admitted under the node's name", "reason", err.Error())
		return status.Errorf(codes.PermissionDenied, "%v; one VM at a time joins under a name (if the other VM is gone for good, the owner removes its node first with 'orrery node remove')", err)
	case errors.Is(err, admissions.ErrRemoved):
		log.Warn("refused a join: the owner removed the state disk's node", "reason", err.Error())
		return status.Errorf(codes.PermissionDenied, "state disk %s: %v; a removed node does not come back: recreate the VM with a new disk and name", strings.ToLower(req.GetDiskUuid()), err)
	case errors.Is(err, admissions.ErrOtherInstance):
		log.Warn("refused a join: the state disk was admitted for another VM", "reason", err.Error())
		return status.Errorf(codes.PermissionDenied, "state disk %s: %v; a VM joins only with a disk of its own", strings.ToLower(req.GetDiskUuid()), err)
	case err != nil:
		log.Error("cannot record the admitted disk", "error", err)
		return status.Errorf(codes.Unavailable, "record the admitted state disk: %v", err)
	}
	return nil
}

// rejoining is a node that passed the checks of every rejoin call
// (checkRejoin).
type rejoining struct {
	inst             attestation.Instance
	disk, keyID, set string
	// rec is the disk's record as the checks read it.
	rec admitted.Record
	log *slog.Logger
}

// checkRejoin runs the checks that a rejoin ticket and each step of the
// disk's generation check pass: the caller attested, with a measurement
// set still accepted, as a certified instance the owner has not removed,
// for a disk admitted for that very instance, whose Node exists.
func (s *Server) checkRejoin(ctx context.Context, diskUUID string) (rejoining, error) {
	info, err := requireAttested(ctx)
	if err != nil {
		return rejoining{}, err
	}
	inst, err := requireInstance(info)
	if err != nil {
		s.log.Warn("refused a rejoin: the node's attestation names no instance", "peer", peerAddr(ctx), "variant", info.PeerVariant.String())
		return rejoining{}, err
	}
	keyID, err := keys.DiskKeyID(diskUUID)
	if err != nil {
		return rejoining{}, status.Error(codes.InvalidArgument, err.Error())
	}
	r := rejoining{inst: inst, disk: strings.ToLower(diskUUID), keyID: keyID}
	r.log = s.log.With("node", inst.Name, "instanceID", inst.ID, "diskUUID", r.disk)
	if r.set, err = s.currentSet(ctx, info); err != nil {
		r.log.Warn("refused a rejoin: the connection's attestation no longer admits the node", "reason", err.Error())
		return rejoining{}, err
	}
	if err := s.refuseRemoved(ctx, r.log, "rejoin", inst); err != nil {
		return rejoining{}, err
	}
	if r.rec, err = s.authorizeRejoin(ctx, r.log, r.disk, inst); err != nil {
		return rejoining{}, err
	}
	return r, nil
}

// IssueRejoinTicket implements joinpb.JoinServiceServer.
func (s *Server) IssueRejoinTicket(ctx context.Context, req *joinpb.IssueRejoinTicketRequest) (*joinpb.IssueRejoinTicketResponse, error) {
	r, err := s.checkRejoin(ctx, req.GetDiskUuid())
	if err != nil {
		return nil, err
	}
	// The initrd keeps the static pod manifests on its disk only if this
	// says so: an unreadable list refuses the rejoin rather than tell a
	// control plane it is a worker, or the reverse.
	controlPlane, err := s.approvedControlPlane(ctx, r.inst)
	if err != nil {
		r.log.Error("cannot read the approved control planes", "error", err.Error())
		return nil, err
	}
	k, err := s.ticketKeys(ctx, r.log, r.keyID)
	if err != nil {
		return nil, err
	}
	if err := s.cfg.Admissions.Attested(ctx, r.disk, r.set); err != nil {
		// Informative only (which image the node runs): not a reason
		// to keep a node from its disk.
		r.log.Warn("cannot record the node's measurement set", "error", err.Error())
	}
	version, err := s.clusterVersion(ctx, r.log)
	if err != nil {
		return nil, err
	}
	r.log.Info("issued rejoin ticket", "controlPlane", controlPlane, "kubernetesVersion", version)
	return &joinpb.IssueRejoinTicketResponse{
		StateDiskKey: k.disk, MeasurementSecret: k.measurementSecret,
		ClusterCaCert: s.cfg.CA.Raw, ApiServerEndpoint: s.cfg.Endpoint, ControlPlane: controlPlane,
		OwnerAccessKey: k.owner, KubernetesVersion: version,
	}, nil
}

// authorizeRejoin decides whether instance inst gets a rejoin ticket for
// disk: the disk must be admitted, for this very VM, whose node the owner
// has not removed. Every refusal is logged. It returns the disk's record.
func (s *Server) authorizeRejoin(ctx context.Context, log *slog.Logger, disk string, inst attestation.Instance) (admitted.Record, error) {
	rec, found, err := s.cfg.Admissions.Lookup(ctx, disk)
	owner := rec.Instance
	switch {
	case err != nil:
		log.Error("cannot read the record of admitted disks", "error", err)
		return rec, status.Errorf(codes.Unavailable, "read the record of admitted disks: %v", err)
	case !found:
		log.Warn("refused a rejoin: the state disk was never admitted, or its node was removed")
		return rec, status.Errorf(codes.PermissionDenied,
			"state disk %s was never admitted to this cluster, or the owner removed its node: a rejoin ticket goes only to the VM the disk was admitted for; to bring this VM back, recreate it and let it join as a new node", disk)
	case rec.Removed():
		log.Warn("refused a rejoin: the owner removed the state disk's node", "removedAt", rec.RemovedAt)
		return rec, status.Errorf(codes.PermissionDenied,
			"the owner removed node %s from the cluster at %s ('orrery node remove'): its state disk %s gets no rejoin ticket, for good; to bring this VM back, recreate it with a new disk and name and let it join as a new node", owner.Name, rec.RemovedAt, disk)
	case owner.ID != inst.ID:
		log.Warn("refused a rejoin: the state disk was admitted for another VM", "admittedFor", owner.String())
		return rec, status.Errorf(codes.PermissionDenied,
			"state disk %s was admitted for %s, not for this node, %s: a rejoin ticket goes only to the VM the disk was admitted for", disk, owner, inst)
	}
	switch exists, err := s.cfg.Nodes.NodeExists(ctx, owner.Name); {
	case err != nil:
		log.Error("cannot read the cluster's nodes", "error", err)
		return rec, status.Errorf(codes.Unavailable, "read the cluster's nodes: %v", err)
	case !exists:
		log.Warn("refused a rejoin: the owner removed the node from the cluster")
		return rec, status.Errorf(codes.PermissionDenied,
			"node %s was removed from the cluster (kubectl delete node): its state disk %s gets no rejoin ticket; to bring this VM back, recreate it and let it join as a new node", owner.Name, disk)
	}
	return rec, nil
}

// keysOfTicket are what a ticket carries from the key service.
type keysOfTicket struct{ disk, measurementSecret, owner []byte }

// ticketKeys asks the key service for the disk key of keyID, the
// measurement secret and the public half of the owner's access key.
func (s *Server) ticketKeys(ctx context.Context, log *slog.Logger, keyID string) (keysOfTicket, error) {
	var k keysOfTicket
	var err error
	if k.disk, err = s.cfg.Keys.GetDataKey(ctx, keyID, 32); err != nil {
		log.Error("key service failed", "error", err)
		return k, status.Errorf(codes.Unavailable, "get the state disk key from the key service: %v", err)
	}
	if k.measurementSecret, err = s.cfg.Keys.GetDataKey(ctx, keypb.MeasurementSecretID, 32); err != nil {
		return k, status.Errorf(codes.Unavailable, "get the measurement secret from the key service: %v", err)
	}
	if k.owner, err = s.cfg.Keys.GetDataKey(ctx, keypb.OwnerAccessKeyID, 32); err != nil {
		return k, status.Errorf(codes.Unavailable, "get the owner's access key from the key service: %v", err)
	}
	return k, nil
}

// currentSet is the measurement set the caller attested with, checked
// to admit it still (Config.CurrentSet). A ticket is refused otherwise:
// an attestation is a statement about the node at its handshake, and the
// owner may have retired its image since.
func (s *Server) currentSet(ctx context.Context, info atls.AuthInfo) (string, error) {
	if len(info.TLS.PeerCertificates) == 0 {
		return "", status.Error(codes.PermissionDenied, "caller did not attest")
	}
	set, err := s.cfg.CurrentSet(ctx, info.TLS.PeerCertificates[0].RawSubjectPublicKeyInfo)
	if err != nil {
		return "", status.Error(codes.PermissionDenied, err.Error())
	}
	return set, nil
}

// refuseRemoved refuses a node the owner removed, by its certified name
// or instance ID: it holds old credentials, perhaps its old disk, and
// gets nothing from the cluster again.
func (s *Server) refuseRemoved(ctx context.Context, log *slog.Logger, what string, inst attestation.Instance) error {
	if s.cfg.Removed == nil {
		return nil
	}
	removed, err := s.cfg.Removed(ctx)
	if err != nil {
		log.Error("cannot read the removed nodes", "error", err.Error())
		return status.Errorf(codes.Unavailable, "read the list of removed nodes: %v", err)
	}
	name, e, ok := removed.Find(inst.Name, inst.ID)
	if !ok {
		return nil
	}
	log.Warn("refused a "+what+": the owner removed this node", "removedAs", name, "removedAt", e.RemovedAt)
	return status.Errorf(codes.PermissionDenied,
		"the owner removed node %s (instance %s) from the cluster at %s ('orrery node remove'), and this node is %s: a removed node gets no ticket again; recreate the VM under a new name, or the owner takes %s off the %s/%s ConfigMap",
		name, e.InstanceID, e.RemovedAt.Format(time.RFC3339), inst, name, removednodes.Namespace, removednodes.ConfigMapName)
}

// requireAttested refuses callers that did not attest: the transport should
// never let one through, and a ticket is worth a second check.
func requireAttested(ctx context.Context) (atls.AuthInfo, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return atls.AuthInfo{}, status.Error(codes.PermissionDenied, "caller did not attest")
	}
	info, ok := p.AuthInfo.(atls.AuthInfo)
	if !ok || info.PeerVariant == (variant.Variant{}) {
		return atls.AuthInfo{}, status.Error(codes.PermissionDenied, "caller did not attest")
	}
	return info, nil
}

// requireInstance returns the instance the caller's platform certified,
// and refuses a caller whose attestation key certificate names none: the
// join service would not know whom it admits.
func requireInstance(info atls.AuthInfo) (attestation.Instance, error) {
	if info.PeerInstance.IsZero() {
		return attestation.Instance{}, status.Error(codes.PermissionDenied,
			"this node's attestation key certificate names no instance, so the join service cannot tell which node it is: "+
				"its vTPM was provisioned by a local cloud older than instance identities; recreate the VM ('orrery mini down', then 'orrery mini up') so that its vTPM is provisioned again")
	}
	return info.PeerInstance, nil
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// requireApprovedControlPlane refuses control-plane files to an instance
// the owner did not approve. Whether a node asks as a control plane is
// its own choice (its metadata role, or a compromised node's whim); the
// CA keys in those files sign any identity in the cluster, so the rule
// rests on something the node cannot choose: its certified instance ID,
// in a list only the owner writes.
func (s *Server) requireApprovedControlPlane(ctx context.Context, inst attestation.Instance) error {
	ok, err := s.approvedControlPlane(ctx, inst)
	if err != nil || ok {
		return err
	}
	return status.Errorf(codes.PermissionDenied,
		"node %s asked to join as a control plane, and the owner has not approved this instance as one, so it gets no control-plane files: "+
			"to make it a control plane, the owner runs 'orrery control-plane approve %s' (which adds it to %q in the %s ConfigMap); to make it a worker, give it the worker role",
		inst, inst.ID, controlplanes.Key, controlplanes.ConfigMapName)
}

// approvedControlPlane tells whether the owner approved inst's certified
// instance ID as a control plane (Config.ControlPlanes). A list it cannot
// read is an Unavailable error, never an answer: both a join's
// control-plane files and a rejoin's role rest on it.
func (s *Server) approvedControlPlane(ctx context.Context, inst attestation.Instance) (bool, error) {
	if s.cfg.ControlPlanes == nil {
		return false, nil
	}
	approved, err := s.cfg.ControlPlanes(ctx)
	if err != nil {
		return false, status.Errorf(codes.Unavailable, "read the approved control planes: %v", err)
	}
	return slices.Contains(approved, inst.ID), nil
}

// checkCSR parses the node's kubelet CSR and checks it asks for exactly
// what a kubelet should have. It returns the node name the CSR claims,
// which the caller must compare with the attested one. The signed
// certificate takes only the public key from it (see signKubeletCert):
// subject alternative names are allowed in the request, for nodes of an
// older image that still ask for them, and never signed.
func checkCSR(der []byte) (*x509.CertificateRequest, string, error) {
	if len(der) == 0 {
		return nil, "", errors.New("missing")
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, "", fmt.Errorf("not a DER PKCS #10 request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, "", fmt.Errorf("bad signature: %w", err)
	}
	name, ok := strings.CutPrefix(csr.Subject.CommonName, "system:node:")
	if !ok || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return nil, "", fmt.Errorf("common name %q is not system:node:<node name> with a node name Kubernetes accepts (a DNS subdomain)", csr.Subject.CommonName)
	}
	if err := checkKubeletKey(csr.PublicKey); err != nil {
		return nil, "", err
	}
	if !slices.Equal(csr.Subject.Organization, []string{"system:nodes"}) {
		return nil, "", fmt.Errorf("organization %q is not [system:nodes]", csr.Subject.Organization)
	}
	if len(csr.EmailAddresses) > 0 || len(csr.URIs) > 0 {
		return nil, "", errors.New("only DNS names and IP addresses may be requested")
	}
	for _, ext := range csr.Extensions {
		// Only subject alternative names: a CSR must not ask for CA
		// rights or other extensions, which the signer would ignore
		// anyway, but a request for them is a sign of tampering.
		if !ext.Id.Equal([]int{2, 5, 29, 17}) {
			return nil, "", fmt.Errorf("unexpected extension %v", ext.Id)
		}
	}
	return csr, name, nil
}

// checkKubeletKey accepts the keys a kubelet generates and refuses ones too
// weak to serve TLS for years.
func checkKubeletKey(pub any) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve == elliptic.P256() || k.Curve == elliptic.P384() || k.Curve == elliptic.P521() {
			return nil
		}
		return fmt.Errorf("ECDSA key on curve %s: use P-256, P-384 or P-521", k.Curve.Params().Name)
	case *rsa.PublicKey:
		if k.N.BitLen() >= 2048 {
			return nil
		}
		return fmt.Errorf("RSA key of %d bits: use at least 2048", k.N.BitLen())
	case ed25519.PublicKey:
		return nil
	default:
		return fmt.Errorf("unsupported key type %T: use ECDSA, RSA or Ed25519", pub)
	}
}

// signKubeletCert signs the kubelet's client certificate for node name,
// taken from the node's attestation: system:node:<name> in system:nodes,
// the identity the API server's Node authorizer and NodeRestriction admit,
// for client authentication only, with no DNS names or addresses. Nothing
// in it comes from the request but the public key.
//
// It used to be the kubelet's serving certificate, with the names and
// addresses the request asked for: a certificate of the cluster CA, which
// every pod trusts for the API server, for any name a node chose. A kubelet
// serves with its own self-signed certificate instead (Kubernetes'
// default; see bootstrapperd/internal/joinclient): the API server, as
// kubeadm sets it up, does not verify kubelets' serving certificates, so
// the signed one bought no check and only gave nodes that power.
// joinCertLifetime is how long a join ticket's client certificate lasts.
const joinCertLifetime = 24 * time.Hour

func (s *Server) signKubeletCert(name string, pub any) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := s.cfg.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "system:node:" + name, Organization: []string{"system:nodes"}},
		NotBefore:    now.Add(-5 * time.Minute),
		// Only kubeadm join uses it, to have kubelet ask the cluster
		// for a certificate of its own: a day covers a slow or retried
		// join, and a copy that outlived it is worth nothing.
		NotAfter:    now.Add(joinCertLifetime),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return x509.CreateCertificate(rand.Reader, tmpl, s.cfg.CA, pub, s.cfg.CAKey)
}

func (s *Server) controlPlaneFiles() ([]*joinpb.ControlPlaneFile, error) {
	var out []*joinpb.ControlPlaneFile
	for _, name := range controlplanes.PKIFiles {
		data, err := os.ReadFile(filepath.Join(s.cfg.PKIDir, name))
		if errors.Is(err, fs.ErrNotExist) && slices.Contains(controlplanes.KubeletServingCAFiles, name) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, &joinpb.ControlPlaneFile{Name: name, Data: data})
	}
	// A cluster made before the kubelet-serving CA has neither file.
	if n := len(controlplanes.PKIFiles) - len(out); n != 0 && n != len(controlplanes.KubeletServingCAFiles) {
		return nil, fmt.Errorf("%s holds half the kubelet-serving CA's pair %v", s.cfg.PKIDir, controlplanes.KubeletServingCAFiles)
	}
	return out, nil
}

// clusterVersion is the Kubernetes version a ticket names: the one the
// cluster runs, or, while an upgrade has not reached every control plane,
// the oldest a control plane runs. A kubelet may not be newer than any
// API server it talks to.
func (s *Server) clusterVersion(ctx context.Context, log *slog.Logger) (string, error) {
	v, err := s.cfg.ClusterVersion(ctx)
	if err != nil {
		log.Error("cannot read the cluster's Kubernetes version", "error", err.Error())
		return "", status.Errorf(codes.Unavailable, "read the cluster's Kubernetes version: %v", err)
	}
	if s.cfg.ControlPlaneVersions == nil {
		return v, nil
	}
	cps, err := s.cfg.ControlPlaneVersions(ctx)
	if err != nil {
		log.Error("cannot read the control planes' Kubernetes versions", "error", err.Error())
		return "", status.Errorf(codes.Unavailable, "read the control planes' Kubernetes versions: %v", err)
	}
	for _, cp := range cps {
		if versions.Compare(cp, v) < 0 && slices.Contains(versions.List(), cp) {
			v = cp
		}
	}
	return v, nil
}

// components lists version's binaries as this image's manifest names
// them, for the ticket's record; none if the image lacks version.
func components(version string) []*joinpb.KubernetesComponent {
	r, err := versions.Get(version)
	if err != nil {
		return nil
	}
	var cs []*joinpb.KubernetesComponent
	for _, b := range r.Binaries {
		cs = append(cs, &joinpb.KubernetesComponent{Url: "file://" + b.InstallPath, Hash: "sha256:" + b.SHA256, InstallPath: b.InstallPath})
	}
	return cs
}
