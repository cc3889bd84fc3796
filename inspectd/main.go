// Command orrery-inspectd lets the owner inspect a running node: it serves
// inspectpb.InspectService (status, journal, units, kernel log, usage, support bundle)
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
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/inspectserver"
	"github.com/orrery-dev/orrery/internal/logging"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/owneraccess"
	"github.com/orrery-dev/orrery/internal/ownerservice"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
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
	started := time.Now()
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
	if err := run(ctx, c, log, started); err != nil {
		fmt.Fprintf(os.Stderr, "orrery-inspectd: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config, log *slog.Logger, started time.Time) error {
	mlog := &pcrlog.Log{Path: c.measurementLog}
	lock := nodelock.New(tpmdev.Open, mlog)
	svc, err := inspectserver.New(inspectserver.Config{
		Owner:   owneraccess.FromFile(c.ownerKey),
		Journal: inspectserver.Journalctl{},
		Units:   systemdUnits{},
		Status:  inspectserver.Host{Stage: "system", ClusterID: lock.Cluster}.Status,
		Usage:   inspectserver.Usage{}.Read,
		Log:     log,
	})
	if err != nil {
		return err
	}
	return ownerservice.Serve(ctx, ownerservice.Config{
		Listen: c.listen, Socket: "orrery-inspectd.socket", OwnerKey: c.ownerKey,
		MeasurementLog: mlog, FirmwareLog: c.firmwareLog, MetadataURL: c.metadataURL,
		// Answers are bounded by the service; what a client may send is
		// one small request.
		MaxRecvMsgSize: 16 << 10,
		StopWait:       5 * time.Second,
		Started:        started,
		Log:            log,
	}, func(srv *grpc.Server) { inspectpb.RegisterInspectServiceServer(srv, svc) })
}
