package cmd

import (
	"github.com/spf13/cobra"
)

func newUpgradeCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "upgrade",
		Short: "Upgrade Kubernetes or the cluster's services, and change the node images it accepts",
		Long: `upgrade brings the Helm releases Orrery owns in a cluster (orrery-crds,
flannel, orrery-services; 'orrery version' lists them) to the charts this
orrery carries, and adds or retires the node images (measurement sets) the
join service accepts; with --kubernetes-version, it upgrades Kubernetes
on every node in place.

'upgrade check' tells what would change; 'upgrade apply' changes it, after
backing up Orrery's custom resources to your disk. Each release is upgraded
atomically: one whose pods do not become ready in time is rolled back by
Helm to the revision that served, and the releases after it are left alone.
The releases stay ordinary Helm releases: 'helm list', 'helm history' and
'helm rollback' work on them.`,
	}
	c.AddCommand(newUpgradeCheckCmd(), newUpgradeApplyCmd())
	return c
}
