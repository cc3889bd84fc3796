// Command orrery-inspectd lets the owner inspect a running node: it serves
// inspectpb.InspectService (status, journal, units, kernel log, support bundle)
// over attested TLS on port 9001, in which the node attests and the
// client must prove the owner's access key. It only reads.
//
// systemd starts it through orrery-inspectd.socket, early in the boot and
// independent of kubelet and the API server, so that the owner can see
// what a node does while those are down. It runs as its own user,
// orrery-inspect, in the groups that read the journal (systemd-journal)
// and use the TPM (tss); units are read over D-Bus, which needs no
// privilege.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation/nodeattest"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/inspectserver"
	"github.com/orrery-dev/orrery/internal/logging"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/owneraccess"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
	"github.com/orrery-dev/orrery/internal/sdsocket"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
	"github.com/orrery-dev/orrery/internal/tpm/tpmdev"
)

type config struct {
	listen         string
	ownerKey       string
	measurementLog string
	firmwareLog    string
	metadataURL    string
	level          logging.Level
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := config{
		ownerKey:       owneraccess.Path,
		measurementLog: pcrlog.DefaultPath,
		firmwareLog:    vtpm.DefaultFirmwareEventLogPath,
		metadataURL:    metadata.DefaultBaseURL,
	}
	fs := flag.NewFlagSet("orrery-inspectd", flag.ExitOnError)
	fs.StringVar(&c.listen, "listen", "", "listen on this address instead of the socket systemd passes (e.g. :9001)")
	fs.StringVar(&c.ownerKey, "owner-key", c.ownerKey, "the public half of the owner's access key")
	fs.StringVar(&c.measurementLog, "measurement-log", c.measurementLog, "userspace measurement log")
	fs.StringVar(&c.firmwareLog, "firmware-event-log", c.firmwareLog, "the firmware's TCG event log (a readable copy: the original is root's)")
	fs.StringVar(&c.metadataURL, "metadata-url", c.metadataURL, "the cloud's metadata service")
	logging.AddLevelFlag(fs, &c.level)
	_ = fs.Parse(os.Args[1:])
	log := logging.New(logging.Config{Program: "orrery-inspectd", Format: logging.Journal, Level: c.level, Output: os.Stderr})
	if err := run(ctx, c, log); err != nil {
		fmt.Fprintf(os.Stderr, "orrery-inspectd: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config, log *slog.Logger) error {
	lis, err := sdsocket.Listen(c.listen, "orrery-inspectd.socket")
	if err != nil {
		return err
	}
	mlog := &pcrlog.Log{Path: c.measurementLog}
	p, err := nodeattest.DetectUntil(ctx, &metadata.Client{BaseURL: c.metadataURL}, func(_ int, err error) {
		log.Warn("cannot tell which attestation this node's platform offers yet; retrying", "error", err.Error())
	})
	if err != nil {
		return err
	}
	issuer, err := p.Issuer(qemu.IssuerConfig{OpenTPM: tpmdev.Open, FirmwareEventLogPath: c.firmwareLog, MeasurementLog: mlog})
	if err != nil {
		return fmt.Errorf("set up %s attestation: %w", p.Variant, err)
	}
	owner := owneraccess.FromFile(c.ownerKey)
	creds, err := atls.NewCredentials(atls.Config{
		Issuer:          issuer,
		AuthorizeClient: owneraccess.Authorize(owner),
		OnPeerRejected: func(peer net.Addr, err error) {
			log.Warn("refused a caller", "peer", peer.String(), "error", err.Error())
		},
	})
	if err != nil {
		return err
	}
	lock := nodelock.New(tpmdev.Open, mlog)
	svc, err := inspectserver.New(inspectserver.Config{
		Owner:   owner,
		Journal: inspectserver.Journalctl{},
		Units:   systemdUnits{},
		Status:  inspectserver.Host{Stage: "system", ClusterID: lock.Cluster}.Status,
		Log:     log,
	})
	if err != nil {
		return err
	}
	// Answers are bounded by the service; what a client may send is one
	// small request.
	srv := grpc.NewServer(grpc.Creds(creds), grpc.MaxRecvMsgSize(16<<10), grpc.MaxHeaderListSize(16<<10))
	inspectpb.RegisterInspectServiceServer(srv, svc)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	log.Info("serving the owner", "listen", lis.Addr().String(), "attestation", p.Variant.String())
	_, _ = daemon.SdNotify(false, "READY=1\nSTATUS=serving the owner on "+lis.Addr().String())
	select {
	case <-ctx.Done():
		// A follower's stream would hold GracefulStop forever.
		t := time.AfterFunc(5*time.Second, srv.Stop)
		srv.GracefulStop()
		t.Stop()
		return nil
	case err := <-errc:
		return err
	}
}
