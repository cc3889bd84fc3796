package cmd

import (
	"github.com/spf13/cobra"
)

func newMiniCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "mini",
		Short: "Run a local Orrery cluster in QEMU VMs with vTPMs on this machine",
		Long: `mini runs a local cloud on this machine: QEMU VMs booting the Orrery image
(UEFI, a swtpm vTPM each, certified by a local platform CA), a bridge
network with DHCP and a metadata API. Everything lives in one state
directory (./orrery-mini by default): logs, state, the VMs' disks and
vTPMs, the init secret and the platform CA certificate. It needs root
(bridges, taps).

  up      make the VMs and start them
  stop    power them off, keeping their disks
  start   boot the stopped VMs again from their disks
  down    power them off and delete their disks
  status  list the VMs`,
	}
	c.AddCommand(newMiniUpCmd(), newMiniStopCmd(), newMiniStartCmd(), newMiniDownCmd(), newMiniStatusCmd(), newMiniServeCmd())
	return c
}

// addDirFlag adds --mini-dir, the name every command uses for the local
// cloud's directory; 'mini' commands took --dir before.
func addDirFlag(c *cobra.Command, dir *string) {
	c.Flags().StringVar(dir, "mini-dir", "orrery-mini", "state directory of the local cloud")
	c.Flags().StringVar(dir, "dir", "orrery-mini", "state directory of the local cloud")
	_ = c.Flags().MarkDeprecated("dir", "use --mini-dir")
}

// sudoPrefix is what a command that needs root is prefixed with in a hint:
// "sudo " for a user who ran this through sudo or as themselves, nothing
// for root itself (a fresh machine may run everything as root and have
// no sudo installed).
func sudoPrefix(euid int, sudoUser string) string {
	if euid == 0 && sudoUser == "" {
		return ""
	}
	return "sudo "
}
