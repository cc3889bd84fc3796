package cmd

import (
	"fmt"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/records/controlplanes"
)

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

func notSetUp(err error) error {
	return fmt.Errorf("read ConfigMap %s/%s (is this the kubeconfig of a cluster 'orrery init' set up?): %w", controlplanes.Namespace, controlplanes.ConfigMapName, err)
}
