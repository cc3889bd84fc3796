// Command joinservice runs Orrery's in-cluster services on control-plane
// nodes, as two containers of one host-network pod:
//
//	joinservice join   admits attested nodes (port 30090, attested TLS)
//	joinservice keys   derives keys from the master secret (unix socket only)
//
// Both sides of a join attest: the join service first, quoting on the vTPM
// of the control-plane node it runs on, so that a joining node can tell it
// from anyone else on the network before it uses a ticket; then the node.
//
// The join service asks the key service over a unix socket in a directory
// only the two containers share, so keys never cross the network, and no
// other process or host-network pod on the node can ask.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "join":
		err = runJoin(ctx, os.Args[2:])
	case "keys":
		err = runKeys(ctx, os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "joinservice %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: joinservice join|keys [flags] (-h for the flags of each)")
	os.Exit(2)
}
