package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/failurelog"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/initserver"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/joinclient"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/owneraccess"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
	"github.com/orrery-dev/orrery/internal/tpm/tpmdev"
	"github.com/orrery-dev/orrery/internal/versions"
)

// initServer is the init service, wired to this node's lock, state disk,
// metadata service and kubeadm, with the check that the node is who the
// metadata service says (checkName). It needs b.tool.Instance set.
func (b *bootstrapper) initServer(bootstrapped func()) initpb.InitServiceServer {
	return initserver.New(initserver.Config{
		Lock:           b.lock,
		Disk:           b.disk,
		Cluster:        &cluster{tool: b.tool, meta: b.meta},
		InitSecretHash: b.meta.InitSecretHash,
		Supported: func(v string) error {
			_, err := versions.Get(v)
			return err
		},
		CheckNode: func(ctx context.Context) error {
			return checkName(ctx, b.tool.Instance, b.meta.Self, b.log.With("component", "initserver"))
		},
		Journal:      failureReport,
		ResultPath:   b.paths.initResultPath(),
		RecordOwner:  b.recordOwner,
		Bootstrapped: bootstrapped,
		Status:       func(s string) { b.notify("STATUS=" + s) },
		Logger:       b.log,
	})
}

// checkName refuses an init on a node that the metadata service names
// otherwise than its platform certified it in its attestation key
// certificate. The metadata service is the host's: it could give the
// first control plane the name of a worker still to come, under which
// kubeadm init would register it and run the join service (whose pod
// mounts the master secret) on it. The real worker's certified name then
// gets it a kubelet certificate for that Node, and through the Node
// authorizer the Secrets of the pods bound to it. The join service refuses
// a joining node whose names differ the same way.
//
// The init server asks only once the request proved the init secret, and
// before the node lock: refused here, the node is left as it was. kubeadm
// gets the certified name in any case (see cluster.Init), whatever the
// metadata service says later. A node without a certified instance is not
// checked: there is no name to hold the metadata service's to.
func checkName(ctx context.Context, certified attestation.Instance, self func(context.Context) (metadata.Instance, error), log *slog.Logger) error {
	if certified.IsZero() {
		return nil
	}
	me, err := self(ctx)
	if err != nil {
		return status.Errorf(codes.Unavailable, "ask the metadata service who this node is: %v", err)
	}
	if me.Name != certified.Name {
		log.Warn("init refused: the metadata service names this node otherwise than its attestation key certificate",
			"phase", "check-request", "metadataName", me.Name, "node", certified.Name, "instanceID", certified.ID)
		return status.Errorf(codes.FailedPrecondition,
			"the metadata service names this node %q, but its attestation key certificate names it %s: the first control plane registers only under the name its platform certified, and this node is left as it was; check the name the metadata service gives this VM, then run 'orrery init' again",
			me.Name, certified)
	}
	return nil
}

// join runs the join client until the node joined a cluster (then it
// calls bootstrapped), an init took the node, or ctx ends.
func (b *bootstrapper) join(ctx context.Context, bootstrapped func()) {
	cas, err := qemu.OwnPlatformCAs(b.openTPM)
	if err != nil {
		b.log.Error("the join client cannot run: it has nothing to check a join service's attestation against, and takes no ticket from an unproven one; this node can still be initialised with 'orrery init'",
			"phase", "join", "error", err)
		return
	}
	cfg := b.joinConfig()
	cfg.PlatformCAs = cas
	// A node holds its join service to the hardware evidence of its own
	// kind; on a qemu-vtpm node that is none.
	if cfg.Peer, err = b.detected.PeerPolicy(); err != nil {
		b.log.Error("the join client cannot run: it cannot tell what a join service's hardware evidence must show, and takes no ticket from a join service it cannot check; this node can still be initialised with 'orrery init'",
			"phase", "join", "variant", b.detected.Variant.String(), "error", err)
		return
	}
	err = joinclient.Run(ctx, cfg)
	switch {
	case err == nil:
		b.log.Info("joined the cluster", "phase", "joined")
		bootstrapped()
	case errors.Is(err, joinclient.ErrLockLost), errors.Is(err, context.Canceled):
		// Initialised by the owner, or stopping: the init path decides.
	default:
		b.log.Error("join failed", "phase", "join", "error", err)
	}
}

// joinConfig is the join client's configuration, but for the platform
// CAs, which only a new join needs.
func (b *bootstrapper) joinConfig() joinclient.Config {
	return joinclient.Config{
		Metadata:      b.meta,
		Issuer:        b.issuer,
		OpenTPM:       b.openTPM,
		Lock:          b.lock,
		Disk:          b.disk,
		Joiner:        &joiner{tool: b.tool},
		StateDir:      b.paths.stateDir,
		RecordOwner:   b.recordOwner,
		KubeletPKIDir: b.paths.kubeletPKIDir,
		PKIDir:        b.paths.pkiDir,
		Logger:        b.log,
		Status:        func(s string) { b.notify("STATUS=" + s) },
	}
}

// finishJoin completes a join that a reboot interrupted after the node
// lock (see pendingjoin.File): the initrd rejoined, and kubeadm join
// must still run, with the ticket kept on the state disk.
func (b *bootstrapper) finishJoin(ctx context.Context) error {
	b.notify("READY=1\nSTATUS=finishing a join that a reboot interrupted")
	if err := joinclient.Finish(ctx, b.joinConfig()); err != nil {
		return fmt.Errorf("finish the interrupted join: %w", err)
	}
	b.log.Info("joined the cluster", "phase", "joined")
	b.endBootstrap(ctx)
	return nil
}

// selfInstance is this node's VM as its platform certified it, which an
// init approves as the first control plane. Without it (a VM provisioned
// before AK certificates named instances) init still works, and no
// control plane is approved: joining nodes are refused anyway, since the
// join service cannot tell who they are either.
func selfInstance(openTPM tpmdev.Opener, log *slog.Logger) attestation.Instance {
	rw, err := openTPM()
	if err != nil {
		log.Warn("cannot read this node's certified instance; an init will approve no control plane", "error", err)
		return attestation.Instance{}
	}
	defer rw.Close()
	inst, err := qemu.ReadInstance(rw)
	if err != nil || inst.IsZero() {
		log.Warn("this node's attestation key certificate names no instance; an init will approve no control plane, and the join service will refuse nodes like it: recreate the VMs", "error", err)
		return attestation.Instance{}
	}
	log.Info("this node's certified instance", "node", inst.Name, "instanceID", inst.ID)
	return inst
}

// importImages waits until orrery-images.service has linked the baked
// container images into containerd. Its line in out, in kubeadm's
// "[phase]" form, lets the owner's timeline tell this wait from kubeadm's
// own phases.
func importImages(ctx context.Context, tool *kubeadm.Tool, out io.Writer) error {
	fmt.Fprintln(out, "[orrery-images] linking the baked container images into containerd")
	if err := tool.Runner.Run(ctx, "systemctl", []string{"start", "orrery-images.service"}, nil, out); err != nil {
		return fmt.Errorf("import the baked container images: %w", err)
	}
	return nil
}

// joiner runs kubeadm join once the baked images are in containerd.
type joiner struct{ tool *kubeadm.Tool }

func (j *joiner) Join(ctx context.Context, p kubeadm.JoinParams, out io.Writer) error {
	if err := importImages(ctx, j.tool, out); err != nil {
		return err
	}
	return j.tool.Join(ctx, p, out)
}

func (j *joiner) Reset(ctx context.Context, out io.Writer) error { return j.tool.Reset(ctx, out) }

// cluster runs kubeadm for the init server with this node's certified
// name (the metadata service's only on a node without one) and its address
// from the metadata service.
type cluster struct {
	tool *kubeadm.Tool
	meta *metadata.Client
}

func (c *cluster) Init(ctx context.Context, p initserver.ClusterParams, out io.Writer) ([]byte, error) {
	self, err := c.meta.Self(ctx)
	if err != nil {
		return nil, fmt.Errorf("ask the metadata service who this node is: %w", err)
	}
	// kubeadm finds its images only once they are imported into containerd.
	if err := importImages(ctx, c.tool, out); err != nil {
		return nil, err
	}
	// checkName checked the metadata service's name before the lock; its
	// answer now does not matter where the platform certified one.
	name := self.Name
	if !c.tool.Instance.IsZero() {
		name = c.tool.Instance.Name
	}
	return c.tool.Init(ctx, kubeadm.InitParams{
		NodeName:          name,
		NodeIP:            self.IP,
		KubernetesVersion: p.KubernetesVersion,
		ClusterName:       p.ClusterName,
		ServiceCIDR:       p.ServiceCIDR,
		CertSANs:          p.APIServerSANs,
	}, out)
}

func (c *cluster) Reset(ctx context.Context, out io.Writer) error { return c.tool.Reset(ctx, out) }

func (c *cluster) StoreMasterSecret(ctx context.Context, ms keys.MasterSecret, salt []byte) error {
	return c.tool.StoreMasterSecret(ctx, ms, salt)
}

// failureReport is what the owner gets when an init fails: this boot's
// journal and the ends of the control-plane containers' logs, bounded so
// that the report fits in one gRPC message.
func failureReport(ctx context.Context) ([]byte, error) {
	var journal bytes.Buffer
	// More lines than are kept: kubelet's noise is left out first.
	cmd := exec.CommandContext(ctx, "journalctl", "--boot", "--no-pager", "--lines", "20000")
	cmd.Stdout = &journal
	err := cmd.Run()
	report := failurelog.Journal(journal.Bytes(), failurelog.DefaultLimits)
	return append(report, failurelog.ContainerLogs("/var/log/pods", failurelog.DefaultLimits)...), err
}

// recordOwner keeps the owner's access key where the inspect service reads
// it, and in the state disk's header for the initrd of later boots.
func (b *bootstrapper) recordOwner(ctx context.Context, key ed25519.PublicKey) error {
	if err := owneraccess.Write(b.paths.ownerKey, key); err != nil {
		return fmt.Errorf("record the owner's access key: %w", err)
	}
	return b.disk.RecordOwner(ctx, key)
}
