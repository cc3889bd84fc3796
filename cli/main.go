// Command orrery is the cluster owner's tool: it verifies nodes, initialises
// clusters, approves control planes and runs a local cloud of QEMU VMs
// with vTPMs ('orrery mini'). The flows live in internal/owner; this
// command parses flags and prints.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/orrery-dev/orrery/cli/internal/cmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(cmd.Execute(ctx, os.Args[1:], os.Stdout, os.Stderr))
}
