package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/initserver"
	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/journallog"
	"github.com/orrery-dev/orrery/internal/measurelog"
	"github.com/orrery-dev/orrery/internal/nodelock"
)

type config struct {
	listen             string
	measurementLog     string
	firmwareLog        string
	bootstrappedMarker string
	// stateDir is on the state disk; it keeps what an interrupted init
	// needs to be finished.
	stateDir string
	openTPM  func() (io.ReadWriteCloser, error)
	// stopGrace is how long open RPCs may run on once the daemon stops;
	// then they are cut. Zero means defaultStopGrace.
	stopGrace time.Duration
}

// defaultStopGrace lets an init stream deliver its last message (the
// kubeconfig) after the node is bootstrapped, yet does not let a client
// that holds a stream open (a health Watch) keep the daemon alive.
const defaultStopGrace = 10 * time.Second

func defaultConfig() config {
	node := qemu.NodeIssuerConfig()
	return config{
		measurementLog:     node.MeasurementLog.Path,
		firmwareLog:        node.FirmwareEventLogPath,
		bootstrappedMarker: "/var/lib/orrery/bootstrapped",
		stateDir:           stateDir,
		openTPM:            node.OpenTPM,
	}
}

// StatusWaiting is what the daemon tells systemd and the journal while the
// node belongs to no cluster.
const StatusWaiting = "waiting for init or join"

func run(ctx context.Context, cfg config, log *slog.Logger) error {
	start := time.Now()
	mlog := &measurelog.Log{Path: cfg.measurementLog}
	lock := nodelock.New(cfg.openTPM, mlog)
	locked, err := lock.IsLocked()
	if err != nil {
		return fmt.Errorf("read node lock: %w", err)
	}
	// A lock without a finished init is an init this daemon was stopped
	// in: leaving now would strand the node, locked and without a cluster.
	resume := false
	if locked {
		resume, err = initserver.Interrupted(initserver.Config{Lock: lock, ResultPath: initResultPath(cfg)})
		if err != nil {
			return fmt.Errorf("look for an interrupted init: %w", err)
		}
	}
	if _, err := os.Stat(cfg.bootstrappedMarker); err == nil || locked && !resume {
		log.Info("node is already part of a cluster; nothing to do", "phase", "bootstrapped")
		notify("READY=1\nSTATUS=bootstrapped")
		return nil
	}
	if resume {
		log.Info("an init locked this node and was interrupted; waiting for its owner to run 'orrery init' again to finish it", "phase", "resume")
	}

	lis, err := listener(cfg.listen)
	if err != nil {
		return err
	}
	ctx, bootstrapped := context.WithCancel(ctx)
	defer bootstrapped()
	return serve(ctx, cfg, lis, log, start, func(srv *grpc.Server, issuer attestation.Issuer) {
		registerNodeServices(ctx, cfg, srv, lock, issuer, resume, func() {
			log.Info("node bootstrapped; bootstrapperd stops", "phase", "bootstrapped")
			notify("STATUS=bootstrapped")
			if cfg.listen == "" {
				stopSocket(ctx, log)
			}
			bootstrapped()
		})
	})
}

// serve runs the attested-TLS gRPC server on lis until ctx ends.
// register adds further services; they get the server's issuer, so that
// the node attests with one issuer whichever side it is on.
func serve(ctx context.Context, cfg config, lis net.Listener, log *slog.Logger, start time.Time, register func(*grpc.Server, attestation.Issuer)) error {
	mlog := &measurelog.Log{Path: cfg.measurementLog}
	issuer, err := qemu.NewIssuer(qemu.IssuerConfig{
		OpenTPM:              cfg.openTPM,
		FirmwareEventLogPath: cfg.firmwareLog,
		MeasurementLog:       mlog,
	})
	if err != nil {
		return err
	}
	creds, err := atls.NewCredentials(atls.Config{Issuer: issuer})
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.Creds(creds))
	healthSrv := health.NewServer()
	healthpb.RegisterHealthServer(srv, healthSrv)
	if register != nil {
		register(srv, issuer)
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	log.Info(StatusWaiting, "phase", "wait", "listen", lis.Addr().String(), "startup", time.Since(start).Round(time.Millisecond))
	notify("READY=1\nSTATUS=" + StatusWaiting)

	select {
	case <-ctx.Done():
		log.Info("stopping", "phase", "stop")
		notify("STOPPING=1")
		// Watchers learn that the node stops serving before their streams close.
		healthSrv.Shutdown()
		stopWithin(srv, cfg.stopGrace, log)
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
func listener(addr string) (net.Listener, error) {
	if addr != "" {
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("listen on %s: %w", addr, err)
		}
		return lis, nil
	}
	lis, err := activation.Listeners()
	if err != nil {
		return nil, fmt.Errorf("sockets from systemd: %w", err)
	}
	if len(lis) != 1 || lis[0] == nil {
		return nil, errors.New("expected exactly one listening socket from systemd (bootstrapperd.socket); start it through systemd or pass --listen")
	}
	return lis[0], nil
}

// stopSocket closes port 9000 for good. systemd, not this process, holds
// the listening socket: left open, it would queue connections that no
// bootstrapper will ever serve (its unit's condition fails on a
// bootstrapped node), and an owner's 'orrery init' would hang instead of
// being refused. --no-block: stopping the socket stops this service too,
// and the job must not wait for us.
func stopSocket(ctx context.Context, log *slog.Logger) {
	out, err := exec.CommandContext(ctx, "systemctl", "stop", "--no-block", "bootstrapperd.socket").CombinedOutput()
	if err != nil {
		log.Warn("cannot stop bootstrapperd.socket; port 9000 stays open", "error", err, "output", string(out))
	}
}

func notify(state string) {
	// Outside systemd there is no notify socket; that is fine.
	_, _ = daemon.SdNotify(false, state)
}

// slogTo logs to journald with a field per attribute (PHASE=, PEER=,
// CLUSTER_ID=), or as text to w outside systemd.
func slogTo(w io.Writer) *slog.Logger {
	return journallog.New("bootstrapperd", w).With("component", "bootstrapperd")
}

// daemonLog is the daemon's log: slogTo(os.Stderr), copied to the serial
// console. journald forwards nothing to the console, which the host
// reads; bootstrapperd's log is written for that reader (it never holds
// a secret) and is the only account of a node that has no login.
var daemonLog = sync.OnceValue(func() *slog.Logger {
	console, err := os.OpenFile("/dev/console", os.O_WRONLY|os.O_APPEND|syscall.O_NOCTTY, 0)
	if err != nil {
		log := slogTo(os.Stderr)
		log.Warn("cannot write to the console; the log is in the journal only", "error", err)
		return log
	}
	return journallog.NewWithConsole("bootstrapperd", os.Stderr, console).With("component", "bootstrapperd")
})
