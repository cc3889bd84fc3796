package cmd

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/cloud"
)

func newMiniDownCmd() *cobra.Command {
	var (
		dir string
		yes bool
	)
	c := &cobra.Command{
		Use:   "down",
		Short: "Stop the local cloud and delete its VMs' disks",
		Long: `down stops the VMs, the network and the services of the local cloud in
--mini-dir, also after a crash, and deletes the VMs' disks, their vTPM state
and the init secret: the cluster on them is gone for good ('orrery mini
stop' keeps them). It asks first, unless --yes. The VMs' logs (<dir>/<vm>/serial.log, qemu.log) stay for
reading afterwards, and so does the platform CA, so that the next 'mini up'
certifies its VMs with the same CA. The owner's workspace (master secret,
kubeconfig) is not touched: the next 'orrery init' there needs
--replace-workspace, or another --workspace.`,
		Example: "  orrery mini down\n  orrery mini down --yes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := cloud.ReadState(dir)
			if errors.Is(err, os.ErrNotExist) {
				fmt.Fprintf(cmd.OutOrStdout(), "No local cloud recorded in %s: nothing to do.\n", dir)
				return nil
			}
			if !yes {
				var names []string
				for _, n := range st.Nodes {
					names = append(names, n.Name)
				}
				ok, err := confirm(cmd.InOrStdin(), cmd.OutOrStdout(), fmt.Sprintf("Delete the VMs %s of %s with their disks and vTPMs?", strings.Join(names, ", "), dir))
				if err != nil {
					return err
				}
				if !ok {
					return errors.New("nothing deleted")
				}
			}
			if err := cloud.Cleanup(cmd.Context(), dir); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "The local cloud is down.")
			return nil
		},
	}
	addDirFlag(c, &dir)
	c.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask before deleting the VMs' disks")
	return c
}
