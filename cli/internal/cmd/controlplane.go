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

	"github.com/orrery-dev/orrery/internal/controlplanes"
	"github.com/orrery-dev/orrery/internal/role"
)

func newControlPlaneCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   string(role.ControlPlane),
		Short: "Decide which VMs may be the cluster's control planes",
		Long: `The join service hands the cluster's CA keys only to a VM whose instance ID
the owner approved as a control plane: what a node says its role is decides
nothing. 'orrery init' approves the node it initialises; approve every
further control plane here before (or while) it joins.`,
	}
	c.AddCommand(newControlPlaneApproveCmd())
	return c
}

func newControlPlaneApproveCmd() *cobra.Command {
	var kc kubeconfigOptions
	c := &cobra.Command{
		Use:   "approve INSTANCE-ID",
		Short: "Let the VM with this instance ID join as a control plane",
		Long: `approve adds an instance ID to the approved control planes (the
controlPlaneInstanceIDs key of the orrery-join-config ConfigMap in
kube-system). The ID is the one the platform certified in the VM's
attestation key certificate: 'orrery verify --node ADDRESS' prints it, and
the join service's refusal of the VM names it. The join service reads the
list on every request: a waiting node is admitted on its next attempt once
the ConfigMap reaches the service (a minute or so).`,
		Example: `  orrery verify --node 10.42.1.101 --measurements build/image/measurements.json \
    --platform-ca orrery-mini/platform-ca.crt
  orrery control-plane approve 7264511298031765023`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rc, err := kc.restConfig(workspaceDir(cmd))
			if err != nil {
				return err
			}
			client, err := kubernetes.NewForConfig(rc)
			if err != nil {
				return err
			}
			return approveControlPlane(cmd.Context(), client.CoreV1().ConfigMaps(controlplanes.Namespace), args[0], cmd.OutOrStdout())
		},
	}
	addKubeconfigFlags(c.Flags(), &kc)
	return c
}

// configMaps is what approveControlPlane needs of the API server.
type configMaps interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.ConfigMap, error)
	Update(ctx context.Context, cm *corev1.ConfigMap, opts metav1.UpdateOptions) (*corev1.ConfigMap, error)
}

// approveControlPlane adds id to the approved control planes, retrying
// when another writer changed the ConfigMap in between.
func approveControlPlane(ctx context.Context, cms configMaps, id string, out io.Writer) error {
	var added bool
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, controlplanes.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("read ConfigMap %s/%s (is this the kubeconfig of a cluster 'orrery init' set up?): %w", controlplanes.Namespace, controlplanes.ConfigMapName, err)
		}
		var text string
		if text, added, err = controlplanes.Approve(cm.Data[controlplanes.Key], id); err != nil || !added {
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
