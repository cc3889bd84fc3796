// Package cmd implements the orrery command line.
package cmd

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// Execute runs the command line with args and returns the exit code.
func Execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return 1
	}
	return 0
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "orrery",
		Short: "Run Kubernetes on confidential VMs whose every node proves what it runs",
		Long: `orrery is the cluster owner's tool. It checks what a node runs through the
node's vTPM attestation before it trusts the node with any secret.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newVerifyCmd(), newInitCmd(), newMiniCmd(), newControlPlaneCmd())
	return root
}
