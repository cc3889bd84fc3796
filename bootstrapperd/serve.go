package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/initserver"
	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/logging"
)

// defaultStopGrace lets an init stream deliver its last message (the
// kubeconfig) after the node is bootstrapped, yet does not let a client
// that holds a stream open (a health Watch) keep the daemon alive.
const defaultStopGrace = 10 * time.Second

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
