// Command bootstrapperd runs on every node until the node belongs to a
// cluster. It serves attested TLS on port 9000 (the socket comes from
// systemd socket activation, or --listen for tests) so the owner can verify
// the node and initialise a cluster on it; the join client that lets a node
// join an existing cluster runs beside it. Once the node lock is taken it
// is not needed on that node again.
//
// 'bootstrapperd pcrs' prints the node's PCR values and exits: a unit runs
// it at boot so the journal and console show them. 'bootstrapperd
// static-pods' makes a control plane's static pods what kubeadm writes for
// its cluster: a unit runs it before kubelet (see rewriteStaticPods).
// 'bootstrapperd serve-upgrades' serves the owner's Kubernetes upgrades of
// the node on port 9002 (see serveUpgrades).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/kuberelease"
	"github.com/orrery-dev/orrery/internal/attestation/nodeattest"
	"github.com/orrery-dev/orrery/internal/disk/handoff"
	"github.com/orrery-dev/orrery/internal/logging"
	"github.com/orrery-dev/orrery/internal/tpm/tpmdev"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == "pcrs" {
		exit(printPCRs(os.Stdout))
	}
	if len(os.Args) > 1 && os.Args[1] == "static-pods" {
		p := nodePaths()
		tool := &kubeadm.Tool{Runner: kubeadm.ExecRunner{}, ConfigDir: p.runDir}
		exit(rewriteStaticPods(ctx, manifestsDir, tool, tpmdev.Open, os.Stdout))
	}
	if len(os.Args) > 1 && os.Args[1] == "serve-upgrades" {
		exit(serveUpgrades(ctx, os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "kubernetes-release" {
		exit(chooseBootRelease(kuberelease.Node{Root: "/"}, handoff.ClusterVersionFile, manifestsDir, os.Stdout))
	}
	fs := flag.NewFlagSet("bootstrapperd", flag.ExitOnError)
	p := nodePaths()
	var listen string
	var level logging.Level
	logging.AddLevelFlag(fs, &level)
	fs.StringVar(&listen, "listen", "", "listen on this address instead of the socket systemd passes (e.g. :9000)")
	fs.StringVar(&p.measurementLog, "measurement-log", p.measurementLog, "userspace measurement log")
	fs.StringVar(&p.firmwareLog, "firmware-event-log", p.firmwareLog, "the firmware's TCG event log")
	fs.StringVar(&p.bootstrappedMarker, "bootstrapped-marker", p.bootstrappedMarker, "file that marks the node as part of a cluster")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: bootstrapperd [flags]\n       bootstrapperd pcrs\n       bootstrapperd kubernetes-release\n       bootstrapperd static-pods\n       bootstrapperd serve-upgrades [flags]\n\n")
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:])
	b, err := newBootstrapper(p, tpmdev.Open, daemonLog(level))
	if err != nil {
		exit(err)
	}
	b.listen = listen
	exit(run(ctx, b))
}

func exit(err error) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "bootstrapperd: %v\n", err)
	}
	os.Exit(exitCode(err))
}

// exitRefused is bootstrapperd's exit status when the node refuses what
// its platform offers (nodeattest.RefusedError): starting again cannot
// change that, so bootstrapperd.service does not restart on it
// (RestartPreventExitStatus). 78 is sysexits' EX_CONFIG.
const exitRefused = 78

func exitCode(err error) int {
	var refused *nodeattest.RefusedError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &refused):
		return exitRefused
	}
	return 1
}
