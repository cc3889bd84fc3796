package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/initserver"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/nodestate"
	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/logging"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
	"github.com/orrery-dev/orrery/internal/sdsocket"
)

// defaultStopGrace lets an init stream deliver its last message (the
// kubeconfig) after the node is bootstrapped, yet does not let a client
// that holds a stream open (a health Watch) keep the daemon alive.
const defaultStopGrace = 10 * time.Second

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

// server returns the attested-TLS gRPC server with its health service.
// The node attests with the daemon's one issuer, on whichever side of a
// connection it is.
func (b *bootstrapper) server() (*grpc.Server, *health.Server, error) {
	creds, err := atls.NewCredentials(atls.Config{Issuer: b.issuer})
	if err != nil {
		return nil, nil, err
	}
	// Until the init secret is checked its peer is anyone on the
	// network: gRPC receives no more than the largest init request, in
	// fixed windows, so a refused request costs the node kilobytes, not
	// gRPC's default 4 MiB.
	srv := grpc.NewServer(grpc.Creds(creds),
		grpc.MaxRecvMsgSize(initserver.MaxRequestSize),
		grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10),
		grpc.MaxHeaderListSize(16<<10))
	healthSrv := health.NewServer()
	healthpb.RegisterHealthServer(srv, healthSrv)
	return srv, healthSrv, nil
}

// serve runs srv on lis until ctx ends.
func (b *bootstrapper) serve(ctx context.Context, srv *grpc.Server, healthSrv *health.Server, lis net.Listener, start time.Time) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	b.log.Info(StatusWaiting, "phase", "wait", "listen", lis.Addr().String(), "startup", time.Since(start).Round(time.Millisecond))
	b.notify("READY=1\nSTATUS=" + StatusWaiting)

	select {
	case <-ctx.Done():
		b.log.Info("stopping", "phase", "stop")
		b.notify("STOPPING=1")
		// Watchers learn that the node stops serving before their streams close.
		healthSrv.Shutdown()
		stopWithin(srv, b.stopGrace, b.log)
		return nil
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	}
}

// stopWithin stops srv gracefully, but for at most grace: GracefulStop
// alone waits for every open stream, and any client may keep one open.
func stopWithin(srv *grpc.Server, grace time.Duration, log *slog.Logger) {
	if grace <= 0 {
		grace = defaultStopGrace
	}
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		log.Warn("open RPCs did not finish; closing them", "phase", "stop", "grace", grace)
		srv.Stop()
		<-stopped
	}
}

// listener takes the socket systemd passes, or listens on addr.

// stopSocket closes port 9000 for good. systemd, not this process, holds
// the listening socket: left open, it would queue connections that no
// bootstrapper will ever serve (its unit's condition fails on a
// bootstrapped node), and an owner's 'orrery init' would hang instead of
// being refused. --no-block: stopping the socket stops this service too,
// and the job must not wait for us.
//
// The job stops this service at once, and systemd's SIGTERM reaches every
// process of its cgroup, systemctl too if it has not exited yet: that
// means the job runs, not that it failed.
func stopSocket(ctx context.Context, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "systemctl", "stop", "--no-block", "bootstrapperd.socket").CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			log.Info("bootstrapperd.socket is stopping", "phase", "stop")
			return
		}
	}
	if err != nil {
		log.Warn("cannot stop bootstrapperd.socket; port 9000 stays open", "error", err, "output", string(out))
	}
}

func notify(state string) {
	// Outside systemd there is no notify socket; that is fine.
	_, _ = daemon.SdNotify(false, state)
}

// daemonLog is the daemon's log: journald, with a field per attribute
// (PHASE=, PEER=, CLUSTER_ID=), copied to the serial console. journald
// forwards nothing to the console, which the host reads; bootstrapperd's
// log is written for that reader (it never holds a secret) and is the only
// account of a node that has no login.
func daemonLog(level logging.Level) *slog.Logger {
	cfg := logging.Config{Program: "bootstrapperd", Format: logging.Journal, Level: level, Output: os.Stderr}
	console, err := os.OpenFile("/dev/console", os.O_WRONLY|os.O_APPEND|syscall.O_NOCTTY, 0)
	if err != nil {
		log := logging.New(cfg)
		log.Warn("cannot write to the console; the log is in the journal only", "error", err)
		return log
	}
	cfg.Console = console
	return logging.New(cfg)
}
