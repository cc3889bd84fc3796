package cmd

import (
	"context"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

// approvedList is 'control-plane list' as data.
type approvedList struct {
	InstanceIDs []string `json:"instanceIDs"`
}

// configMaps is what the control-plane commands need of the API server.
type configMaps interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.ConfigMap, error)
	Update(ctx context.Context, cm *corev1.ConfigMap, opts metav1.UpdateOptions) (*corev1.ConfigMap, error)
}
