package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/joinclient"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/kuberelease"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
)

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
		Metadata:           b.meta,
		Issuer:             b.issuer,
		OpenTPM:            b.openTPM,
		Lock:               b.lock,
		Disk:               b.disk,
		Joiner:             &joiner{tool: b.tool, release: kuberelease.Node{Root: b.paths.root}},
		StateDir:           b.paths.stateDir,
		ClusterVersionFile: b.paths.clusterVersion,
		RecordOwner:        b.recordOwner,
		KubeletPKIDir:      b.paths.kubeletPKIDir,
		PKIDir:             b.paths.pkiDir,
		Logger:             b.log,
		Status:             func(s string) { b.notify("STATUS=" + s) },
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
