package cmd

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/cloud/vm"
)

func newMiniServeCmd() *cobra.Command {
	var (
		o      miniOptions
		resume bool
	)
	c := &cobra.Command{
		Use:    "serve",
		Short:  "Run the local cloud in the foreground (started by 'mini up' and 'mini start')",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// SIGTERM from 'mini stop', 'mini down' or 'mini up' on Ctrl-C
			// stops it in order; 'mini down' then deletes the files.
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			var (
				c   *cloud.Cloud
				err error
			)
			if resume {
				c, err = cloud.Resume(ctx, o.dir, cmd.OutOrStdout())
			} else {
				c, err = cloud.Up(ctx, o.spec(cmd.OutOrStdout()))
			}
			if err != nil {
				return err
			}
			if accel, _ := c.Accel(); accel == vm.AccelTCG {
				if err := cloud.RaiseSessionPriority(); err != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "warning: %v; on a busy host the control plane may not keep up\n", err)
				}
			}
			<-ctx.Done()
			return c.Stop(context.Background())
		},
	}
	addUpFlags(c, &o)
	c.Flags().BoolVar(&resume, "resume", false, "start the stopped cloud in --mini-dir again; the other flags are ignored")
	return c
}
