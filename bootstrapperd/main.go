// Command bootstrapperd runs on every node until the node belongs to a
// cluster. It serves attested TLS on port 9000 (the socket comes from
// systemd socket activation, or --listen for tests) so the owner can verify
// the node and initialise a cluster on it; the join client that lets a node
// join an existing cluster runs beside it. Once the node lock is taken it
// is not needed on that node again.
//
// 'bootstrapperd pcrs' prints the node's PCR values and exits: a unit runs
// it at boot so the journal and console show them.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == "pcrs" {
		exit(printPCRs(os.Stdout))
	}
	fs := flag.NewFlagSet("bootstrapperd", flag.ExitOnError)
	cfg := defaultConfig()
	fs.StringVar(&cfg.listen, "listen", "", "listen on this address instead of the socket systemd passes (e.g. :9000)")
	fs.StringVar(&cfg.measurementLog, "measurement-log", cfg.measurementLog, "userspace measurement log")
	fs.StringVar(&cfg.firmwareLog, "firmware-event-log", cfg.firmwareLog, "the firmware's TCG event log")
	fs.StringVar(&cfg.bootstrappedMarker, "bootstrapped-marker", cfg.bootstrappedMarker, "file that marks the node as part of a cluster")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: bootstrapperd [flags]\n       bootstrapperd pcrs\n\n")
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:])
	log := daemonLog()
	exit(run(ctx, cfg, log))
}

func exit(err error) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "bootstrapperd: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}
