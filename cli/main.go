// Command orrery is the cluster owner's tool: it verifies nodes, initialises
// clusters and (in later versions) runs a local cluster in QEMU.
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
