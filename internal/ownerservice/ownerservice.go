// Package ownerservice serves a node's gRPC services that answer its owner
// alone: over attested TLS in which the node attests (with its platform's
// evidence and its measurement log) and the client must prove the owner's
// access key (owneraccess) before any request is read.
package ownerservice

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation/nodeattest"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/owneraccess"
	"github.com/orrery-dev/orrery/internal/sdsocket"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
	"github.com/orrery-dev/orrery/internal/tpm/tpmdev"
)

// Config says where a service listens and what it attests with.
type Config struct {
	// Listen is an address to listen on instead of the socket systemd
	// passes under the name Socket (a unit's name, e.g. "x.socket").
	Listen, Socket string
	// OwnerKey is the file with the public half of the owner's access key
	// (owneraccess.Path on a node), read on each connection: a node learns
	// it when it joins, long after the service started.
	OwnerKey string
	// MeasurementLog is the node's userspace measurement log, and
	// FirmwareLog a copy of the firmware's event log the service can read.
	MeasurementLog *pcrlog.Log
	FirmwareLog    string
	// MetadataURL is the cloud's metadata service, which names the
	// platform's attestation where the hardware does not.
	MetadataURL string
	// MaxRecvMsgSize bounds one message a client sends.
	MaxRecvMsgSize int
	// StopWait is how long a stop waits for running calls before it
	// cuts them.
	StopWait time.Duration
	// Started is when the program started, if known: the ready line
	// gives the time since, so that a slow socket-activated start shows
	// where it went (the rest is systemd's, between its "Starting" line
	// and the program's start).
	Started time.Time
	Log     *slog.Logger
}

// Serve serves the services register adds until ctx ends, telling
// systemd it is ready once it listens.
func Serve(ctx context.Context, c Config, register func(*grpc.Server)) error {
	lis, err := sdsocket.Listen(c.Listen, c.Socket)
	if err != nil {
		return err
	}
	detectStart := time.Now()
	p, err := nodeattest.DetectUntil(ctx, &metadata.Client{BaseURL: c.MetadataURL}, func(_ int, err error) {
		c.Log.Warn("cannot tell which attestation this node's platform offers yet; retrying", "error", err.Error())
	})
	if err != nil {
		return err
	}
	issuer, err := p.Issuer(qemu.IssuerConfig{OpenTPM: tpmdev.Open, FirmwareEventLogPath: c.FirmwareLog, MeasurementLog: c.MeasurementLog, Logger: c.Log})
	if err != nil {
		return fmt.Errorf("set up %s attestation: %w", p.Variant, err)
	}
	creds, err := atls.NewCredentials(atls.Config{
		Issuer:          issuer,
		AuthorizeClient: owneraccess.Authorize(owneraccess.FromFile(c.OwnerKey)),
		OnPeerRejected: func(peer net.Addr, err error) {
			c.Log.Warn("refused a caller", "peer", peer.String(), "error", err.Error())
		},
	})
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.Creds(creds), grpc.MaxRecvMsgSize(c.MaxRecvMsgSize), grpc.MaxHeaderListSize(16<<10))
	register(srv)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	ready := []any{"listen", lis.Addr().String(), "attestation", p.Variant.String(), "detect_platform", time.Since(detectStart).Round(time.Millisecond)}
	if !c.Started.IsZero() {
		ready = append(ready, "startup", time.Since(c.Started).Round(time.Millisecond))
	}
	c.Log.Info("serving the owner", ready...)
	_, _ = daemon.SdNotify(false, "READY=1\nSTATUS=serving the owner on "+lis.Addr().String())
	select {
	case <-ctx.Done():
		// A follower's stream would hold GracefulStop forever.
		t := time.AfterFunc(c.StopWait, srv.Stop)
		srv.GracefulStop()
		t.Stop()
		return nil
	case err := <-errc:
		return err
	}
}
