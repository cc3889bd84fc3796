// Package cmd implements the orrery command line.
package cmd

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/logging"
	"github.com/orrery-dev/orrery/internal/termtext"
)

// Execute runs the command line with args and returns the exit code.
// Everything it prints passes through termtext: nodes and the API server
// supply much of it, and none of theirs may drive the owner's terminal.
func Execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	stdout, stderr = termtext.NewWriter(stdout), termtext.NewWriter(stderr)
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
	level := &logging.Level{Level: slog.LevelWarn}
	root.PersistentFlags().Var(level, "log-level", logging.LevelUsage)
	root.PersistentFlags().String("workspace", ".", "the owner's directory: 'orrery init' writes the master secret, state and admin kubeconfig there, and the other commands read them from it")
	root.AddCommand(newVerifyCmd(), newInitCmd(), newRecoverCmd(), newMiniCmd(), newControlPlaneCmd(), newVersionCmd(), newUpgradeCmd(), newStatusCmd(), newNodeCmd(),
		newLogsCmd(), newServicesCmd(), newDmesgCmd(), newTopCmd(), newSupportCmd())
	return root
}

// logger is the log of a command: text on its standard error, at the
// level of --log-level (warnings by default: the owner reads the command's
// own output, and the log adds what a validator warns about).
func logger(cmd *cobra.Command) *slog.Logger {
	level, _ := cmd.Flag("log-level").Value.(*logging.Level)
	if level == nil {
		level = &logging.Level{Level: slog.LevelWarn}
	}
	return logging.New(logging.Config{Program: "orrery", Format: logging.Text, Level: *level, Output: cmd.ErrOrStderr()})
}
