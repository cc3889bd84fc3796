package cmd

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/orrery-dev/orrery/internal/records/controlplanes"
	"github.com/orrery-dev/orrery/internal/role"
)

func newControlPlaneCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   string(role.ControlPlane),
		Short: "Decide which VMs may be the cluster's control planes",
		Long: `The join service hands the cluster's CA keys only to a VM whose instance ID
the owner approved as a control plane: what a node says its role is decides
nothing. 'orrery init' approves the node it initialises; approve every
further control plane here before (or while) it joins. The list is the
controlPlaneInstanceIDs key of the orrery-join-config ConfigMap in
kube-system; the join service reads it on every request, so a change
reaches it within a minute or two.`,
	}
	c.AddCommand(newControlPlaneListCmd(), newControlPlaneApproveCmd(), newControlPlaneRevokeCmd())
	return c
}

func newControlPlaneListCmd() *cobra.Command {
	var (
		kc     kubeconfigOptions
		output string
	)
	c := &cobra.Command{
		Use:   "list",
		Short: "List the instance IDs approved as control planes",
		Long: `list prints the instance IDs the join service may hand the cluster's CA
keys. With -o json or yaml: {"instanceIDs": [...]}.`,
		Example: "  orrery control-plane list\n  orrery control-plane list -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			cms, err := controlPlaneConfigMaps(cmd, kc)
			if err != nil {
				return err
			}
			cm, err := cms.Get(cmd.Context(), controlplanes.ConfigMapName, metav1.GetOptions{})
			if err != nil {
				return notSetUp(err)
			}
			ids, err := controlplanes.Parse(cm.Data[controlplanes.Key])
			if err != nil {
				return err
			}
			if output != "text" {
				return writeData(cmd.OutOrStdout(), output, approvedList{InstanceIDs: append([]string{}, ids...)})
			}
			for _, id := range ids {
				fmt.Fprintln(cmd.OutOrStdout(), id)
			}
			return nil
		},
	}
	addKubeconfigFlags(c.Flags(), &kc)
	addOutputFlag(c, &output)
	describeOutput(c, approvedList{})
	return c
}

// approvedList is 'control-plane list' as data.
type approvedList struct {
	InstanceIDs []string `json:"instanceIDs"`
}

func newControlPlaneApproveCmd() *cobra.Command {
	var kc kubeconfigOptions
	c := &cobra.Command{
		Use:   "approve INSTANCE-ID",
		Short: "Let the VM with this instance ID join as a control plane",
		Long: `approve adds an instance ID to the approved control planes. The ID is the
one the platform certified in the VM's attestation key certificate: 'orrery
verify --node ADDRESS' prints it, and the join service's refusal of the VM
names it. A waiting node is admitted on its next attempt once the change
reaches the join service (a minute or so).`,
		Example: `  orrery verify --node 10.42.1.101
  orrery control-plane approve 7264511298031765023`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cms, err := controlPlaneConfigMaps(cmd, kc)
			if err != nil {
				return err
			}
			return approveControlPlane(cmd.Context(), cms, args[0], cmd.OutOrStdout())
		},
	}
	addKubeconfigFlags(c.Flags(), &kc)
	return c
}

func newControlPlaneRevokeCmd() *cobra.Command {
	var kc kubeconfigOptions
	c := &cobra.Command{
		Use:   "revoke INSTANCE-ID",
		Short: "Stop letting the VM with this instance ID join as a control plane",
		Long: `revoke takes an instance ID off the approved control planes: the join
service no longer hands that VM the cluster's CA keys, for a first join or
a rejoin. It does not take a control plane that runs out of the cluster:
its node keeps the keys it holds.`,
		Example: "  orrery control-plane revoke 7264511298031765023",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cms, err := controlPlaneConfigMaps(cmd, kc)
			if err != nil {
				return err
			}
			return revokeControlPlane(cmd.Context(), cms, args[0], cmd.OutOrStdout())
		},
	}
	addKubeconfigFlags(c.Flags(), &kc)
	return c
}

func controlPlaneConfigMaps(cmd *cobra.Command, kc kubeconfigOptions) (configMaps, error) {
	rc, err := kc.restConfig(workspaceDir(cmd))
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return client.CoreV1().ConfigMaps(controlplanes.Namespace), nil
}

// configMaps is what the control-plane commands need of the API server.
type configMaps interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.ConfigMap, error)
	Update(ctx context.Context, cm *corev1.ConfigMap, opts metav1.UpdateOptions) (*corev1.ConfigMap, error)
}

func notSetUp(err error) error {
	return fmt.Errorf("read ConfigMap %s/%s (is this the kubeconfig of a cluster 'orrery init' set up?): %w", controlplanes.Namespace, controlplanes.ConfigMapName, err)
}

// updateList changes the list of approved control planes with change,
// retrying when another writer changed the ConfigMap in between, and
// reports whether change changed it.
func updateList(ctx context.Context, cms configMaps, change func(text string) (string, bool, error)) (bool, error) {
	var changed bool
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, controlplanes.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return notSetUp(err)
		}
		var text string
		if text, changed, err = change(cm.Data[controlplanes.Key]); err != nil || !changed {
			return err
		}
		cm = cm.DeepCopy()
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[controlplanes.Key] = text
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
	return changed, err
}

// approveControlPlane adds id to the approved control planes.
func approveControlPlane(ctx context.Context, cms configMaps, id string, out io.Writer) error {
	added, err := updateList(ctx, cms, func(text string) (string, bool, error) { return controlplanes.Approve(text, id) })
	if err != nil {
		return fmt.Errorf("approve instance %s as a control plane: %w", id, err)
	}
	if !added {
		fmt.Fprintf(out, "Instance %s is already an approved control plane.\n", id)
		return nil
	}
	fmt.Fprintf(out, "Approved instance %s as a control plane. The join service sees it within a minute or two; the VM's next join attempt gets the control-plane files.\n", id)
	return nil
}

// revokeControlPlane takes id off the approved control planes.
func revokeControlPlane(ctx context.Context, cms configMaps, id string, out io.Writer) error {
	removed, err := updateList(ctx, cms, func(text string) (string, bool, error) { return controlplanes.Revoke(text, id) })
	if err != nil {
		return fmt.Errorf("revoke instance %s as a control plane: %w", id, err)
	}
	if !removed {
		return fmt.Errorf("instance %s is not an approved control plane: 'orrery control-plane list' lists them", id)
	}
	fmt.Fprintf(out, "Revoked instance %s: within a minute or two the join service stops handing it the cluster's CA keys.\n", id)
	return nil
}
