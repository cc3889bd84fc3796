// Package joinconn is a node's connection to a join service: attested TLS
// on which both sides attest, and on which the node sends nothing until
// the service has proved that it is a control plane of the node's own
// image. bootstrapperd's join client and the initrd's rejoin use it.
//
// The service's attestation must show:
//   - an attestation key certified by the platform CA that certified this
//     node's own (Config.PlatformCAs): a genuine vTPM of this platform;
//   - PCRs 4, 9 and 11 equal to this node's own: the same firmware-loaded
//     kernel, initrd and UKI, hence the same verity root, that is the same
//     image, booted through the same initrd phases;
//   - PCRs 12 and 13 zero (ZeroPCRs): the UKI booted with its own command
//     line, and no credentials or system extensions were added to it;
//   - PCR 15 not zero: the node lock locked it to a cluster, as it does on
//     every control plane, and no image this one trusts runs the join
//     service anywhere else.
//
// On a confidential VM the host still controls the vTPM, and the
// platform CA the node trusts is read from that vTPM: the vTPM alone
// would let the host play the join service from any VM and hand the node
// a ticket (its disk key, its owner's access key, the cluster it joins).
// There the service must also show hardware evidence of this node's own
// kind (Config.Peer, from nodeattest.Platform.PeerPolicy), bound to the
// same session as its vTPM quote:
//   - on an SEV-SNP node, an SEV-SNP report with the node's own launch
//     measurement (variant gcp-sev-snp);
//   - on a TDX node, a TD quote with the node's own MRTD, RTMR1 and RTMR2
//     (variant gcp-tdx; tdx.PeerRTMRs says why those), from Intel's
//     quoting enclave.
//
// The service must attest as the node does: a node of a hardware variant
// never accepts a join service that shows a vTPM alone. The node has no
// collateral cache, so it checks neither the revocation of the report's
// signing key nor (on TDX) the platform's TCB status; the owner's
// commands and the join service, which have one, do.
//
// An image may also trust the control planes of other images, named on
// its kernel command line (TrustParam): a new image, during a rollout,
// trusts the join services of the image it replaces. The command line is
// part of the UKI, measured into PCR 11, so a node of an image that trusts
// more attests otherwise, and joins only if the owner accepted that image.
// A TDX node trusts no other image: its RTMRs name its own boot chain,
// and the parameter names the other image by its PCRs only.
//
// So an answer comes from a genuine node of this image (or of an image it
// trusts) that is locked to
// some cluster, through a process that can quote on its vTPM: on an
// Orrery node, only the join service can (its pod is the only one given
// the TPM). It does not show that the cluster is the one this node
// belongs to: a genuine control plane of another cluster of the same
// image passes. Such a service can admit a new node into its own cluster
// (which the metadata service, naming the control planes, can arrange
// anyway), but it cannot learn a secret of this node's cluster, and the
// disk key it would hand a rejoining node does not open the node's disk.
//
// Once a node knows its cluster ID (its disk opened), it can ask for
// more: Dialer.OfCluster accepts only a join service whose PCR 15 is that
// of a node locked to that very cluster. The node's word on its own
// disk's generation must reach its own cluster's join service, not one
// of a cluster the host runs on the same image, which would accept any.
package joinconn

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/gcp"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/nodeattest"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/tpm/tpmdev"
)

// ImagePCRs are the PCRs in which the join service must equal this node:
// the kernel and initrd the firmware loaded (4, 9) and the UKI with the
// initrd's phase markers (11), whose command line carries the verity root
// hash. Equal values mean the same image, booted the same way.
var ImagePCRs = []uint32{4, 9, 11}

// ZeroPCRs must be all zeros in the join service's quote, as
// image/nodeimage predicts them for every image and as 'orrery init' and
// 'orrery verify' enforce them through the image's measurements.
// systemd-stub measures into 12 a command line the boot loader passed
// (which it accepts when Secure Boot is off) and credentials, and into 13
// system extensions: a host that booted the genuine UKI with a verity root
// hash of its own on the command line shows this image's PCRs 4, 9 and 11
// with a non-zero 12.
var ZeroPCRs = []uint32{12, 13}

// LockPCR is the node lock's PCR. A control plane is locked to its
// cluster, so the join service's must not be zero.
const LockPCR = 15

// callTimeout bounds one call, handshake included: a service that stops
// answering must not hold the node.
const callTimeout = 2 * time.Minute

// RefusedError means the join service at Addr did not prove that it is a
// control plane of this node's image; nothing it sent was used.
type RefusedError struct {
	Addr string
	// Hardware is what the service's hardware evidence had to show
	// (nodeattest.PeerPolicy.Describe); "" on a qemu-vtpm node.
	Hardware string
	// Err is why: the attestation's check (naming a PCR or a hardware
	// report's field that differs, or the attestation key's
	// certificate), or that it did not attest, or not as this node does.
	Err error
	// OwnCluster is true if its PCR 15 had to be that of this node's
	// own cluster (Dialer.OfCluster).
	OwnCluster bool
}

func (e *RefusedError) Error() string {
	hw := ""
	if e.Hardware != "" {
		hw = ", and " + e.Hardware + " beside it"
	}
	lock := "set by the node lock"
	if e.OwnCluster {
		lock = "locked to this node's own cluster"
	}
	return fmt.Sprintf("refused the join service at %s, and used nothing it sent: it did not prove that it is a control plane running this node's image "+
		"(attestation key certified by this node's platform CA, PCRs %v equal to this node's own, PCRs %v zero, PCR %d %s%s): %v; "+
		"check that the control planes run this image and that nothing else answers on their port %d", e.Addr, ImagePCRs, ZeroPCRs, LockPCR, lock, hw, e.Err, joinpb.Port)
}

func (e *RefusedError) Unwrap() error { return e.Err }

// Config is what a Dialer needs.
type Config struct {
	// Issuer attests this node to the join service. Required.
	Issuer attestation.Issuer
	// OpenTPM opens this node's TPM; the dialer reads its own ImagePCRs
	// from it, which the join service must show too. Required.
	OpenTPM tpmdev.Opener
	// PlatformCAs certify the attestation keys of genuine nodes: on a
	// node, the CA that certified its own (qemu.ReadPlatformCA).
	// Required.
	PlatformCAs []*x509.Certificate
	Logger      *slog.Logger
	// DialNet opens the TCP connection to a join service; nil dials it.
	// Tests route addresses to servers of their own, as an attacker on
	// the network could.
	DialNet func(ctx context.Context, addr string) (net.Conn, error)
	// Cmdline returns the kernel command line, which may name further
	// images to trust (TrustParam); nil reads /proc/cmdline.
	Cmdline func() ([]byte, error)
	// Peer is what the join service's hardware evidence must show besides
	// its PCRs: what this node's own shows (nodeattest.Platform.PeerPolicy).
	// Its variant must be the Issuer's: the service attests as this node
	// does. The zero value, a vTPM alone, is accepted only with a
	// qemu-vtpm Issuer.
	Peer nodeattest.PeerPolicy
}

// TrustParam is the kernel command-line parameter that names another
// image whose control planes this node accepts as join services, by its
// ImagePCRs' SHA-256 values in hex, in that order, comma-separated. It
// may be given more than once.
const TrustParam = "orrery.trust_join_service"

// Dialer calls join services.
type Dialer struct {
	cfg Config
	// images name the images whose join services it accepts, by their
	// ImagePCRs: this node's own, then the ones it trusts.
	images []measurements.M
	// cluster is the cluster ID the service's PCR 15 must show; nil for
	// any cluster.
	cluster []byte
	service anyOf
	log     *slog.Logger
}

// New reads this node's own PCRs and returns a dialer that accepts only
// join services that show them (see the package comment).
func New(cfg Config) (*Dialer, error) {
	if cfg.Issuer == nil || cfg.OpenTPM == nil {
		return nil, errors.New("join service dialer: Issuer and OpenTPM are required")
	}
	if len(cfg.PlatformCAs) == 0 {
		return nil, errors.New("join service dialer: no platform CA to check the join service's attestation key against; the node would accept an answer from anyone")
	}
	if cfg.Peer.Variant == (variant.Variant{}) {
		cfg.Peer.Variant = variant.QEMUVTPM
	}
	if own := cfg.Issuer.Variant(); cfg.Peer.Variant != own {
		return nil, fmt.Errorf("join service dialer: this node attests as %s, but would hold its join service to %s: a node holds its join service to the evidence of its own kind (give it nodeattest.Platform.PeerPolicy)", own, cfg.Peer.Variant)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	own, err := ownPCRs(cfg.OpenTPM)
	if err != nil {
		return nil, err
	}
	m := measurements.M{}
	for _, pcr := range ImagePCRs {
		m[pcr] = measurements.Measurement{Expected: own[pcr]}
	}
	readCmdline := cfg.Cmdline
	if readCmdline == nil {
		readCmdline = func() ([]byte, error) { return os.ReadFile("/proc/cmdline") }
	}
	cmdline, err := readCmdline()
	if err != nil {
		return nil, fmt.Errorf("join service dialer: read the kernel command line: %w", err)
	}
	trusted, err := TrustedImages(string(cmdline))
	if err != nil {
		return nil, fmt.Errorf("join service dialer: %w", err)
	}
	if len(trusted) > 0 && cfg.Peer.ImageBound() {
		log.Warn("not trusting the join services of the further images named on the kernel command line: on this platform a join service's hardware evidence names its image, which the command line does not give; only control planes of this node's own image can admit it",
			"images", len(trusted), "variant", cfg.Peer.Variant.String())
		trusted = nil
	}
	d := &Dialer{cfg: cfg, images: append([]measurements.M{m}, trusted...), log: log}
	if d.service, err = d.validators(); err != nil {
		return nil, err
	}
	if len(trusted) > 0 {
		log.Info("trusting the join services of further images named on the kernel command line", "images", len(trusted))
	}
	return d, nil
}

// OfCluster returns a dialer that accepts, of the join services d
// accepts, only those locked to the cluster clusterID: their PCR 15 must
// be nodelock.Expected(clusterID). The node need not be locked itself
// (join services admit only nodes whose PCR 15 is zero).
func (d *Dialer) OfCluster(clusterID []byte) (*Dialer, error) {
	if len(clusterID) == 0 {
		return nil, errors.New("join service dialer: no cluster ID to hold the join service to")
	}
	out := *d
	out.cluster = bytes.Clone(clusterID)
	var err error
	if out.service, err = out.validators(); err != nil {
		return nil, err
	}
	return &out, nil
}

// validators check the join service of each of d's images.
func (d *Dialer) validators() (anyOf, error) {
	var vs anyOf
	for _, image := range d.images {
		m := withZeroPCRs(image)
		if d.cluster != nil {
			m[LockPCR] = measurements.Measurement{Expected: nodelock.Expected(d.cluster)}
		}
		v, err := serviceValidator(d.cfg, m, d.log.With("check", "join service attestation"))
		if err != nil {
			return nil, fmt.Errorf("join service dialer: %w", err)
		}
		vs = append(vs, v)
	}
	return vs, nil
}

// serviceValidator checks a join service of the image m as a node of
// cfg.Peer's variant: through its vTPM alone on a qemu-vtpm node, through
// its vTPM and its hardware evidence (cfg.Peer.TEEVerifier) on an
// SEV-SNP or TDX node. No variant falls back to another.
func serviceValidator(cfg Config, m measurements.M, log *slog.Logger) (attestation.Validator, error) {
	tv, err := cfg.Peer.TEEVerifier()
	if err != nil {
		return nil, fmt.Errorf("what the join service's hardware evidence must show: %w", err)
	}
	gc := gcp.ValidatorConfig{
		Measurements: m, AKRoots: cfg.PlatformCAs, AKInstance: noInstance,
		NonZero: []uint32{LockPCR}, TEE: tv, Logger: log,
	}
	switch cfg.Peer.Variant {
	case variant.QEMUVTPM:
		return qemu.NewValidator(qemu.ValidatorConfig{Measurements: m, PlatformCAs: cfg.PlatformCAs, NonZero: []uint32{LockPCR}, Logger: log})
	case variant.GCPSEVSNP:
		return gcp.NewSEVSNPValidator(gc)
	case variant.GCPTDX:
		return gcp.NewTDXValidator(gc)
	}
	return nil, fmt.Errorf("no join service check for a %s node", cfg.Peer.Variant)
}

// noInstance: the node does not ask which VM its join service runs on.
func noInstance(*x509.Certificate) (attestation.Instance, error) { return attestation.Instance{}, nil }

// withZeroPCRs is m, which names an image by its ImagePCRs, with ZeroPCRs
// required to be zero: an image this node trusts boots as this one does,
// from its UKI's own command line.
func withZeroPCRs(m measurements.M) measurements.M {
	out := m.Copy()
	for _, pcr := range ZeroPCRs {
		out[pcr] = measurements.Measurement{Expected: make([]byte, measurements.DigestSize)}
	}
	return out
}

// TrustedImages reads the images cmdline names with TrustParam. A
// malformed value is an error: the node must not guess what it trusts.
func TrustedImages(cmdline string) ([]measurements.M, error) {
	var out []measurements.M
	for _, field := range strings.Fields(cmdline) {
		value, ok := strings.CutPrefix(field, TrustParam+"=")
		if !ok {
			continue
		}
		parts := strings.Split(value, ",")
		if len(parts) != len(ImagePCRs) {
			return nil, fmt.Errorf("kernel parameter %s: want %d comma-separated SHA-256 values (PCRs %v), got %d", TrustParam, len(ImagePCRs), ImagePCRs, len(parts))
		}
		m := measurements.M{}
		for i, pcr := range ImagePCRs {
			v, err := hex.DecodeString(parts[i])
			if err != nil || len(v) != measurements.DigestSize {
				return nil, fmt.Errorf("kernel parameter %s: PCR %d: want %d bytes of hex", TrustParam, pcr, measurements.DigestSize)
			}
			m[pcr] = measurements.Measurement{Expected: v}
		}
		out = append(out, m)
	}
	return out, nil
}

// TrustValue is the TrustParam value that trusts the image of m.
func TrustValue(m measurements.M) (string, error) {
	var parts []string
	for _, pcr := range ImagePCRs {
		v, ok := m[pcr]
		if !ok || len(v.Expected) != measurements.DigestSize {
			return "", fmt.Errorf("the measurements have no SHA-256 value of PCR %d", pcr)
		}
		parts = append(parts, hex.EncodeToString(v.Expected))
	}
	return strings.Join(parts, ","), nil
}

// anyOf accepts an attestation that one of its validators accepts: the
// join service of this node's image or of an image it trusts. They are of
// one variant.
type anyOf []attestation.Validator

func (a anyOf) Variant() variant.Variant { return a[0].Variant() }

func (a anyOf) Validate(ctx context.Context, doc, nonce []byte) ([]byte, error) {
	var errs []string
	for i, v := range a {
		userData, err := v.Validate(ctx, doc, nonce)
		if err == nil {
			return userData, nil
		}
		if i == 0 {
			errs = append(errs, err.Error())
		} else {
			errs = append(errs, fmt.Sprintf("trusted image %d: %v", i, err))
		}
	}
	return nil, errors.New(strings.Join(errs, "; "))
}

// Call connects to the join service at addr ("host:port") and runs call
// on the connection. call must pass the given option to each of its RPCs,
// which records the connection's peer. A request goes out only after the
// service's attestation was accepted; if it was not, or if the answer
// came over a connection on which the service did not attest, Call
// returns a *RefusedError and call's result must not be used.
func (d *Dialer) Call(ctx context.Context, addr string, call func(ctx context.Context, c joinpb.JoinServiceClient, opt grpc.CallOption) error) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	creds, err := atls.NewCredentials(atls.Config{Issuer: d.cfg.Issuer, Validators: []attestation.Validator{d.service}})
	if err != nil {
		return err
	}
	hs := atls.NewRecorder(creds)
	// The service's attestation gets the whole call, not gRPC's 20 s.
	opts := []grpc.DialOption{grpc.WithTransportCredentials(hs), atls.HandshakeWithin(callTimeout)}
	if d.cfg.DialNet != nil {
		opts = append(opts, grpc.WithContextDialer(d.cfg.DialNet))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return err
	}
	defer conn.Close()
	var p peer.Peer
	if err := call(ctx, joinpb.NewJoinServiceClient(conn), grpc.Peer(&p)); err != nil {
		if herr := hs.Refusal(); herr != nil {
			return &RefusedError{Addr: addr, Hardware: d.cfg.Peer.Describe(), Err: herr, OwnCluster: d.cluster != nil}
		}
		return err
	}
	// Checked again after the answer, so that a change to the
	// credentials cannot silently let an unproven answer through.
	if info, ok := p.AuthInfo.(atls.AuthInfo); !ok || info.PeerVariant != d.service.Variant() {
		return &RefusedError{Addr: addr, Hardware: d.cfg.Peer.Describe(), Err: errors.New("it answered over a connection on which it did not attest"), OwnCluster: d.cluster != nil}
	}
	return nil
}

// ownPCRs reads this node's SHA-256 values of ImagePCRs from its TPM. They
// cannot change from outside: the network reaches neither the TPM nor the
// boot chain that extended them.
func ownPCRs(open tpmdev.Opener) (map[uint32][]byte, error) {
	rw, err := open()
	if err != nil {
		return nil, fmt.Errorf("join service dialer: open this node's TPM to read its own PCRs: %w", err)
	}
	defer rw.Close()
	sel := tpm2.PCRSelection{Hash: tpm2.AlgSHA256}
	for _, pcr := range ImagePCRs {
		sel.PCRs = append(sel.PCRs, int(pcr))
	}
	got, err := client.ReadPCRs(rw, sel)
	if err != nil {
		return nil, fmt.Errorf("join service dialer: read this node's PCRs %v: %w", ImagePCRs, err)
	}
	out := map[uint32][]byte{}
	for _, pcr := range ImagePCRs {
		v := got.GetPcrs()[pcr]
		if len(v) != measurements.DigestSize {
			return nil, fmt.Errorf("join service dialer: this node's TPM returned no SHA-256 value for PCR %d", pcr)
		}
		out[pcr] = v
	}
	return out, nil
}
