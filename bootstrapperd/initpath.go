package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"os/exec"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/failurelog"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/initserver"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/kuberelease"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
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
		Cluster:        &cluster{tool: b.tool, meta: b.meta, release: kuberelease.Node{Root: b.paths.root}},
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
