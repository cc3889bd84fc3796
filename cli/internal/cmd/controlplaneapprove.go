package cmd

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/orrery-dev/orrery/internal/records/controlplanes"
)

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
			if err := approveControlPlane(cmd.Context(), cms, args[0], cmd.OutOrStdout()); err != nil {
				return err
			}
			recordControlPlane(cmd, args[0], true)
			return nil
		},
	}
	addKubeconfigFlags(c.Flags(), &kc)
	return c
}

// recordControlPlane records the change in the workspace, for 'orrery
// recover', and says when it cannot.
func recordControlPlane(cmd *cobra.Command, id string, approved bool) {
	ws := workspaceDir(cmd)
	if err := ws.RecordControlPlane(id, approved); err != nil {
		consequence := "gives this control plane no master secret"
		if !approved {
			consequence = "still counts this instance among the control planes and may give it the master secret"
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: the workspace %s does not record it (%v): 'orrery recover' from there %s\n", ws, err, consequence)
	}
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
