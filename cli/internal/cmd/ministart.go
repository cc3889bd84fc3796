package cmd

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/role"
)

func newMiniStartCmd() *cobra.Command {
	var dir string
	c := &cobra.Command{
		Use:   "start",
		Short: "Boot the stopped local cloud's VMs again from their disks",
		Long: `start boots the VMs that 'orrery mini stop' powered off, with their disks,
vTPMs, names and addresses, and the cloud's network and services.

A node that belongs to a cluster comes back on its own when the cluster's
join service answers it: workers rejoin once a control plane runs. When
every control plane was stopped, none has a join service to ask: each
waits in its initrd for its owner, who unlocks it with 'orrery recover'
(from the workspace, with the cluster's master secret).`,
		Example: `  orrery mini start
  orrery recover --node 10.42.1.100    # then, for each control plane`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			abs, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			st, err := cloud.ResumeSupervised(cmd.Context(), abs, []string{self, "mini", "serve", "--resume", "--mini-dir", abs}, out)
			if err != nil {
				return err
			}
			printNodes(out, st)
			fmt.Fprintln(out, "\nThe local cloud runs again. Workers rejoin their cluster once a control plane runs;")
			fmt.Fprintln(out, "a control plane whose cluster has no other waits for its owner: run, from the workspace,")
			for _, line := range recoverHints(st, abs) {
				fmt.Fprintln(out, "  "+line)
			}
			fmt.Fprintln(out, "A node never initialised waits for 'orrery init' as before; its init secret is unchanged.")
			return nil
		},
	}
	addDirFlag(c, &dir)
	return c
}

// recoverHints are the 'orrery recover' commands that unlock the control
// planes of the cloud in dir, with the measurements beside the image it
// boots and, for simulated SEV-SNP VMs, the cloud's test root (recover
// takes no test root it is not given).
func recoverHints(st cloud.State, dir string) []string {
	var checks string
	if st.Spec.Image != "" {
		name := "measurements.json"
		if st.Spec.SEVSNP {
			name = "measurements-sev-snp.json"
		}
		checks = " --measurements " + filepath.Join(filepath.Dir(st.Spec.Image), name)
	}
	if st.Spec.SEVSNP {
		checks += " --snp-test-root " + filepath.Join(dir, cloud.SEVSNPTestRoot)
	}
	var hints []string
	for _, n := range st.Nodes {
		if n.Role == role.ControlPlane {
			hints = append(hints, fmt.Sprintf("orrery recover --node %s --mini-dir %s%s", n.IP, dir, checks))
		}
	}
	return hints
}
