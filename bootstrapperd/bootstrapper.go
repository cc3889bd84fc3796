package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/nodestate"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/rekey"
	"github.com/orrery-dev/orrery/internal/attestation/nodeattest"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/disk/cryptsetup"
	"github.com/orrery-dev/orrery/internal/disk/handoff"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/owneraccess"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
	"github.com/orrery-dev/orrery/internal/tpm/tpmdev"
)

// paths are where the daemon finds and keeps its files. On a node they are
// nodePaths(); a test points them into a temporary directory.
type paths struct {
	// root is the node's root, where the image keeps its Kubernetes
	// releases and /run the choice of one (kuberelease).
	root           string
	measurementLog string
	firmwareLog    string
	// bootstrappedMarker marks the node as part of a cluster.
	bootstrappedMarker string
	// stateDir is on the state disk; it keeps what an interrupted init
	// needs to be finished and what a rejoin needs.
	stateDir string
	// runDir is a tmpfs for files that must not outlive the boot
	// (kubeadm's configuration with the node's key).
	runDir        string
	firstBootKey  string
	sysfs         string
	kubeletPKIDir string
	// pkiDir receives a control plane's cluster PKI.
	pkiDir string
	// ownerKey is where the node keeps the owner's access key for the
	// inspect service (owneraccess.Path).
	ownerKey        string
	adminKubeconfig string
	metadataURL     string
	// clusterVersion is where the initrd leaves the version its rejoin
	// ticket named (handoff.ClusterVersionFile).
	clusterVersion string
}

func nodePaths() paths {
	return paths{
		root:               "/",
		measurementLog:     pcrlog.DefaultPath,
		firmwareLog:        vtpm.DefaultFirmwareEventLogPath,
		bootstrappedMarker: "/var/lib/orrery/bootstrapped",
		stateDir:           handoff.StateDir,
		runDir:             "/run/orrery",
		firstBootKey:       handoff.KeyFile,
		sysfs:              "/sys",
		kubeletPKIDir:      "/var/lib/kubelet/pki",
		pkiDir:             "/etc/kubernetes/pki",
		ownerKey:           owneraccess.Path,
		adminKubeconfig:    "/etc/kubernetes/admin.conf",
		metadataURL:        metadata.DefaultBaseURL,
		clusterVersion:     handoff.ClusterVersionFile,
	}
}

// initResultPath is where the init server keeps its result; the record of
// the request that took the node lock goes beside it.
func (p paths) initResultPath() string { return filepath.Join(p.stateDir, "init-result.json") }

// state is where the node keeps what says where it stands (nodestate).
func (p paths) state() nodestate.Files {
	return nodestate.Files{StateDir: p.stateDir, InitResult: p.initResultPath(), Bootstrapped: p.bootstrappedMarker}
}

// bootstrapper is bootstrapperd with each of its dependencies built once: the
// init server and the join client share the node lock (its mutex orders
// them), the state disk, the issuer and the kubeadm tool.
type bootstrapper struct {
	paths paths
	// listen is an address to listen on instead of the socket systemd
	// passes (tests, and a daemon started by hand).
	listen string
	// stopGrace is how long open RPCs may run on once the daemon stops;
	// zero means defaultStopGrace.
	stopGrace time.Duration
	log       *slog.Logger
	openTPM   tpmdev.Opener
	lock      *nodelock.Lock
	issuer    *vtpm.Issuer
	// issuerConfig is what the issuer attests with; platform tells which
	// variant the node's platform offers (nodeattest.Detect), and
	// attestWith makes the issuer of that variant once it is known.
	issuerConfig qemu.IssuerConfig
	platform     func(context.Context) (nodeattest.Platform, error)
	detected     nodeattest.Platform
	meta         *metadata.Client
	tool         *kubeadm.Tool
	disk         *rekey.Disk
	// notify tells systemd the daemon's state (sd_notify).
	notify func(state string)
}

// newBootstrapper builds the bootstrapper of a node whose files are at p and whose TPM
// openTPM opens.
func newBootstrapper(p paths, openTPM tpmdev.Opener, log *slog.Logger) (*bootstrapper, error) {
	mlog := &pcrlog.Log{Path: p.measurementLog}
	icfg := qemu.IssuerConfig{OpenTPM: openTPM, FirmwareEventLogPath: p.firmwareLog, MeasurementLog: mlog, Logger: log}
	// Until the platform is known (run asks), the node attests as a
	// plain vTPM node.
	issuer, err := qemu.NewIssuer(icfg)
	if err != nil {
		return nil, fmt.Errorf("set up attestation: %w", err)
	}
	meta := &metadata.Client{BaseURL: p.metadataURL}
	disk := &rekey.Disk{LUKS: &cryptsetup.Tool{}, Sysfs: p.sysfs, FirstBootKey: p.firstBootKey, TmpDir: p.runDir}
	tool := &kubeadm.Tool{Runner: kubeadm.ExecRunner{}, ConfigDir: p.runDir, AdminKubeconfig: p.adminKubeconfig}
	return &bootstrapper{
		paths:   p,
		log:     log,
		openTPM: openTPM,
		lock:    nodelock.New(openTPM, mlog),
		issuer:  issuer,
		meta:    meta,

		issuerConfig: icfg,
		platform: func(ctx context.Context) (nodeattest.Platform, error) {
			return nodeattest.DetectUntil(ctx, meta, func(_ int, err error) {
				log.Warn("cannot tell which attestation this node's platform offers yet; retrying", "phase", "attest", "error", err.Error())
			})
		},
		detected: nodeattest.Platform{Variant: variant.QEMUVTPM},
		tool:     tool,
		disk:     disk,
		notify:   notify,
	}, nil
}

// attestAsPlatform finds what the node's platform offers for attestation
// and makes the issuer of that variant.
func (b *bootstrapper) attestAsPlatform(ctx context.Context) error {
	p, err := b.platform(ctx)
	if err != nil {
		return err
	}
	issuer, err := p.Issuer(b.issuerConfig)
	if err != nil {
		return fmt.Errorf("set up %s attestation: %w", p.Variant, err)
	}
	b.issuer, b.detected = issuer, p
	b.log.Info("attesting as "+p.Variant.String(), "phase", "attest", "simulated", p.Simulated)
	return nil
}
