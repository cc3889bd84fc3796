package cmd

import (
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/owner/noderemove"
)

func newNodeRemoveCmd() *cobra.Command {
	var (
		kc  kubeconfigOptions
		yes bool
		cfg noderemove.Config
	)
	c := &cobra.Command{
		Use:   "remove NODE",
		Short: "Take a worker out of the cluster for good",
		Long: `remove takes a worker out of the cluster so that it cannot come back,
whatever it still holds (its kubelet's certificate, its state disk):

  1. its disks' admission records are marked removed: the join service never
     again gives out their keys, and the mark cannot be taken back;
  2. it is cordoned and its pods are evicted (DaemonSets' and static pods
     excepted), waiting up to --drain-timeout;
  3. its name and instance go on the kube-system/orrery-removed-nodes list:
     the API server refuses every write of its kubelet's credentials (it
     cannot re-create its Node or renew its certificate) and the join
     service any ticket, also for a new disk;
  4. its Node is deleted.

The VM itself is not touched: delete it with your cloud's tools ('orrery
mini down' for the local cloud). To let a new VM join under the same name,
take the name off the list (kubectl -n kube-system edit configmap
orrery-removed-nodes) once the removed node's certificate has expired (the
cluster signs kubelets' certificates for a week). Control planes cannot be
removed this way.`,
		Example: `  orrery node remove worker-1 --yes`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !yes {
				return fmt.Errorf("removing node %s is permanent: it can never rejoin this cluster; pass --yes to remove it", args[0])
			}
			rc, err := kc.restConfig(workspaceDir(cmd))
			if err != nil {
				return err
			}
			if cfg.Client, err = kubernetes.NewForConfig(rc); err != nil {
				return err
			}
			if cfg.Dynamic, err = dynamic.NewForConfig(rc); err != nil {
				return err
			}
			cfg.Out = cmd.OutOrStdout()
			return noderemove.Remove(cmd.Context(), cfg, args[0])
		},
	}
	addKubeconfigFlags(c.Flags(), &kc)
	c.Flags().BoolVar(&yes, "yes", false, "confirm that the node is to be removed for good")
	c.Flags().DurationVar(&cfg.DrainTimeout, "drain-timeout", 0, "how long to wait for the node's pods to be evicted (default 2m)")
	return c
}
