package cmd

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/cloud"
)

func newMiniStopCmd() *cobra.Command {
	var dir string
	c := &cobra.Command{
		Use:   "stop",
		Short: "Power the local cloud's VMs off and keep their disks",
		Long: `stop powers off the VMs of the local cloud in --mini-dir (each gets the
shutdown timeout to power off, then it is cut) and stops its network and
services. It keeps everything on disk: the VMs' disks and vTPMs, the init
secret and the platform CA. 'orrery mini start' boots the same VMs again;
'orrery mini down' deletes them.`,
		Example: "  orrery mini stop\n  orrery mini start",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if _, err := cloud.ReadState(dir); errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("no local cloud in %s: nothing to stop", dir)
			}
			fmt.Fprintf(out, "Stopping the local cloud in %s...\n", dir)
			already, err := cloud.StopDir(cmd.Context(), dir)
			if err != nil {
				return err
			}
			if already {
				fmt.Fprintln(out, "It was stopped already.")
			}
			sudo := sudoPrefix(os.Geteuid(), os.Getenv("SUDO_USER"))
			fmt.Fprintf(out, "The local cloud is stopped; its VMs' disks and vTPMs are kept.\n"+
				"'%sorrery mini start --mini-dir %s' boots them again; '%sorrery mini down --mini-dir %s' deletes them.\n", sudo, dir, sudo, dir)
			return nil
		},
	}
	addDirFlag(c, &dir)
	return c
}
