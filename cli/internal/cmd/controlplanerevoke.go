package cmd

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/records/controlplanes"
)

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
			if err := revokeControlPlane(cmd.Context(), cms, args[0], cmd.OutOrStdout()); err != nil {
				return err
			}
			recordControlPlane(cmd, args[0], false)
			return nil
		},
	}
	addKubeconfigFlags(c.Flags(), &kc)
	return c
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
