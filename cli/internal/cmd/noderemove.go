package cmd

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/orrery-dev/orrery/internal/owner/inspect"
	"github.com/orrery-dev/orrery/internal/owner/kubeupgrade"
	"github.com/orrery-dev/orrery/internal/owner/noderemove"
)

// controlPlaneDialer reaches control planes' upgrade services as the
// owner; what proves the owner is read at the first dial, so that
// removing a worker needs none of it.
func controlPlaneDialer(cmd *cobra.Command, cluster *clusterOptions) func(ctx context.Context, name, addr string) (noderemove.ControlPlane, error) {
	var owner *inspect.Owner
	return func(ctx context.Context, name, addr string) (noderemove.ControlPlane, error) {
		if owner == nil {
			o, err := cluster.owner(cmd, nil)
			if err != nil {
				return nil, err
			}
			owner = &o
		}
		ctx, cancel := context.WithTimeout(ctx, cluster.timeout)
		defer cancel()
		return kubeupgrade.DialNode(ctx, *owner, name, addr)
	}
}

func newNodeRemoveCmd() *cobra.Command {
	var (
		cluster clusterOptions
		yes     bool
		cfg     noderemove.Config
	)
	c := &cobra.Command{
		Use:   "remove NODE",
		Short: "Take a node out of the cluster for good",
		Long: `remove takes a node out of the cluster so that it cannot come back,
whatever it still holds (its kubelet's certificate, its state disk):

  0. for a control plane: another control plane removes its etcd member,
     and its instance is no longer approved as a control plane;
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
cluster signs kubelets' certificates for a week).

A control plane is removed only while the cluster has another, and only if
etcd keeps a quorum without it: a majority of the voting members left must
answer. --break-etcd-quorum removes it anyway; etcd then serves no write,
and the API server none, until enough members are back. A removed control
plane still holds the cluster's CA keys: if it may be compromised, the
cluster's CA is too.`,
		Example: `  orrery node remove worker-1 --yes
  orrery node remove cp-2 --yes`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !yes {
				return fmt.Errorf("removing node %s is permanent: it can never rejoin this cluster; pass --yes to remove it", args[0])
			}
			rc, err := cluster.kc.restConfig(workspaceDir(cmd))
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
			cfg.DialControlPlane = controlPlaneDialer(cmd, &cluster)
			cfg.Direct = func(addr string) (kubernetes.Interface, dynamic.Interface, error) { return directClients(rc, addr) }
			cfg.Removed = func(name string, ids []string) {
				if ws := workspaceDir(cmd); ws.RecordRemoved(name, ids) != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: the workspace %s does not record the removal: 'orrery recover' from there may still count %s among the control planes and give it the master secret\n", ws, name)
				}
			}
			return noderemove.Remove(cmd.Context(), cfg, args[0])
		},
	}
	addClusterFlags(c.Flags(), &cluster, time.Minute)
	c.Flags().BoolVar(&cfg.BreakQuorum, "break-etcd-quorum", false, "remove a control plane even if etcd loses its quorum without it: etcd, and the API server, then take no write until enough of its members are back")
	c.Flags().BoolVar(&yes, "yes", false, "confirm that the node is to be removed for good")
	c.Flags().DurationVar(&cfg.DrainTimeout, "drain-timeout", 0, "how long to wait for the node's pods to be evicted (default 2m)")
	return c
}

// directClients reach the API server on the control plane at addr, with
// rc's credentials, instead of the cluster's endpoint: kubeadm certifies
// each API server for its node's address too.
func directClients(rc *rest.Config, addr string) (kubernetes.Interface, dynamic.Interface, error) {
	u, err := url.Parse(rc.Host)
	if err != nil {
		return nil, nil, fmt.Errorf("the kubeconfig's server %q: %w", rc.Host, err)
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	direct := rest.CopyConfig(rc)
	direct.Host = "https://" + net.JoinHostPort(addr, port)
	client, err := kubernetes.NewForConfig(direct)
	if err != nil {
		return nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(direct)
	return client, dyn, err
}
