package cmd

import (
	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
)

func newDmesgCmd() *cobra.Command {
	var o logsOptions
	c := &cobra.Command{
		Use:   "dmesg NODE",
		Short: "Show a node's kernel log",
		Long: `dmesg reads a running node's kernel messages of this boot (or of an earlier
one, --boot -1) from its journal, as 'orrery logs' does for units.`,
		Example: `  orrery dmesg worker-0
  orrery dmesg 10.42.1.11 -f`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runJournal(cmd, o, args[0], &inspectpb.JournalRequest{Kernel: true})
		},
	}
	addJournalFlags(c, &o)
	return c
}
