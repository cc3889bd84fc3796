package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"os/exec"
	"sync"
	"time"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/nodestate"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
	"github.com/orrery-dev/orrery/internal/sdsocket"
)

// StatusWaiting is what the daemon tells systemd and the journal while the
// node belongs to no cluster.
const StatusWaiting = "waiting for init or join"

// run serves the node until it belongs to a cluster: the init service for
// the owner and, beside it, the join client. What it does first depends on
// where the node stands (nodestate): a node that belongs to a cluster
// returns at once, and one whose join a reboot interrupted finishes it.
func run(ctx context.Context, b *bootstrapper) error {
	start := time.Now()
	state, err := nodestate.Load(b.lock, b.paths.state())
	if err != nil {
		// A guess would serve init on a node that belongs to a cluster,
		// or leave one that still needs the daemon.
		return fmt.Errorf("cannot tell where the node stands, so bootstrapperd does nothing until it can (systemd starts it again): %w", err)
	}
	step, err := state.Next()
	if err != nil {
		return err
	}
	switch step {
	case nodestate.Rejoined:
		b.rejoined(ctx)
		return nil
	case nodestate.FinishJoin:
		return b.finishJoin(ctx)
	case nodestate.ResumeInit:
		// Leaving now would strand the node, locked and without a cluster.
		b.log.Info("an init locked this node and was interrupted; waiting for its owner to run 'orrery init' again to finish it", "phase", "resume")
	}
	return b.waitForCluster(ctx, step, start)
}

// waitForCluster serves the init service until the node is bootstrapped
// or ctx ends, with the join client beside it unless an interrupted init
// holds the lock (step ResumeInit): only that init's owner can still make
// something of the node then.
func (b *bootstrapper) waitForCluster(ctx context.Context, step nodestate.Step, start time.Time) error {
	if err := b.attestAsPlatform(ctx); err != nil {
		return err
	}
	lis, err := sdsocket.Listen(b.listen, "bootstrapperd.socket")
	if err != nil {
		return err
	}
	srv, healthSrv, err := b.server()
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	bootstrapped := b.onBootstrapped(ctx, stop)
	b.tool.Instance = selfInstance(b.openTPM, b.log)
	initpb.RegisterInitServiceServer(srv, b.initServer(bootstrapped))
	var joining sync.WaitGroup
	if step == nodestate.Wait {
		joining.Go(func() { b.join(ctx, bootstrapped) })
	}
	err = b.serve(ctx, srv, healthSrv, lis, start)
	// The join client may be between a lock and a file write: the daemon
	// returns once it has stopped, not under it.
	stop()
	joining.Wait()
	return err
}

// rejoined is a boot of a node that belongs to a cluster: its initrd got
// the state disk's key from the cluster (or the owner) and locked the node
// to the cluster again. kubelet runs from the configuration on the state
// disk; the daemon says which cluster, closes its socket and leaves.
func (b *bootstrapper) rejoined(ctx context.Context) {
	status := "node is part of a cluster"
	if id, err := b.lock.Cluster(); err == nil {
		status = "rejoined cluster " + hex.EncodeToString(id)
	} else {
		b.log.Warn("cannot tell which cluster the node is locked to", "error", err)
	}
	b.log.Info(status+"; nothing to do", "phase", "rejoined")
	b.notify("READY=1\nSTATUS=" + status)
	if b.listen != "" {
		return // started by hand or by a test: no units to manage
	}
	// kubelet.service is enabled and starts by itself; this only makes
	// sure, in case someone stopped it.
	out, err := exec.CommandContext(ctx, "systemctl", "start", "--no-block", "kubelet.service").CombinedOutput()
	if err != nil {
		b.log.Error("cannot start kubelet", "error", err, "output", string(out))
	}
	stopSocket(ctx, b.log)
}

// onBootstrapped returns what runs once the node belongs to a cluster,
// by init or by join: endBootstrap, then the daemon ends through stop.
func (b *bootstrapper) onBootstrapped(ctx context.Context, stop func()) func() {
	return func() {
		b.endBootstrap(ctx)
		stop()
	}
}

// endBootstrap records that the node belongs to a cluster, whichever path
// got it there, and closes port 9000 for good.
func (b *bootstrapper) endBootstrap(ctx context.Context) {
	if err := b.paths.state().MarkBootstrapped(); err != nil {
		// The node is in its cluster all the same; a later boot finds
		// it locked with nothing pending and reports it rejoined.
		b.log.Error("cannot mark the node bootstrapped; port 9000 opens on later boots until bootstrapperd closes it", "error", err)
	}
	b.log.Info("node bootstrapped; bootstrapperd stops", "phase", "bootstrapped")
	b.notify("STATUS=bootstrapped")
	if b.listen == "" {
		stopSocket(ctx, b.log)
	}
}

// listener takes the socket systemd passes, or listens on addr.
