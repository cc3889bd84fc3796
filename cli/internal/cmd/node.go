package cmd

import (
	"github.com/spf13/cobra"
)

func newNodeCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "node",
		Short: "Manage the cluster's nodes",
	}
	c.AddCommand(newNodeRemoveCmd())
	return c
}
