package cmd

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/owner/upgrade"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
)

func newUpgradeCheckCmd() *cobra.Command {
	var o upgradeCheckOptions
	c := &cobra.Command{
		Use:   "check",
		Short: "Show installed and available versions, and the images the cluster accepts",
		Long: `check compares each of Orrery's releases in the cluster with the chart this
orrery carries, lists the Kubernetes versions, and lists the node images
(measurement sets) the cluster accepts with the nodes that run each. Given
--measurements (repeatable), it also tells whether the cluster accepts
each of those images.`,
		Example: `  orrery upgrade check
  orrery upgrade check --measurements new-image/measurements.json -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(o.output); err != nil {
				return err
			}
			var given []measurementset.Set
			for _, path := range o.measurementsPaths {
				s, err := loadSet(path, o.hardware)
				if err != nil {
					return err
				}
				given = append(given, s)
			}
			cluster, cleanup, err := o.kc.connect(cmd.Context(), workspaceDir(cmd))
			if err != nil {
				return err
			}
			defer cleanup()
			r, err := upgrade.Check(cmd.Context(), cluster, given)
			if err != nil {
				return err
			}
			if o.output != "text" {
				return writeData(cmd.OutOrStdout(), o.output, r)
			}
			return writeCheck(cmd.OutOrStdout(), r)
		},
	}
	addKubeconfigFlags(c.Flags(), &o.kc)
	c.Flags().StringArrayVar(&o.measurementsPaths, "measurements", nil, "an image's measurements.json: tell whether the cluster accepts it (repeatable)")
	addSNPTestRootFlag(c.Flags(), &o.hardware)
	addOutputFlag(c, &o.output)
	describeOutput(c, upgrade.Report{})
	return c
}

// loadSet reads an image's measurements file as a measurement set.
func loadSet(path string, hw hardwareOptions) (measurementset.Set, error) {
	p, err := loadPolicy(path, hw)
	if err != nil {
		return measurementset.Set{}, fmt.Errorf("load measurements: %w", err)
	}
	s, err := measurementset.FromPolicy(p, "")
	if err != nil {
		return measurementset.Set{}, fmt.Errorf("measurements in %s: %w", path, err)
	}
	return s, nil
}

func writeCheck(w io.Writer, r upgrade.Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RELEASE\tNAMESPACE\tINSTALLED\tAVAILABLE\tSTATUS\tUPGRADE")
	var reasons []string
	for _, rel := range r.Releases {
		installed := rel.Installed
		if installed == "" {
			installed = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", rel.Name, rel.Namespace, installed, rel.Available, rel.Status, rel.Action)
		if rel.Reason != "" {
			reasons = append(reasons, rel.Name+": "+rel.Reason)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, reason := range reasons {
		fmt.Fprintf(w, "  %s\n", reason)
	}
	fmt.Fprintf(w, "\nKubernetes: the cluster runs %s; this orrery's image supports %s\n", r.KubernetesVersion, strings.Join(r.KubernetesVersions, ", "))
	if len(r.KubernetesUpgrades) == 0 {
		fmt.Fprintln(w, "  no newer version to upgrade to")
	}
	for _, v := range r.KubernetesUpgrades {
		fmt.Fprintf(w, "  upgrade available: %s ('orrery upgrade apply --kubernetes-version %s'; every node's image must carry it)\n", v, v)
	}
	fmt.Fprintln(w, "\nImages the cluster accepts (measurement sets):")
	for _, img := range r.Images {
		nodes := "no node"
		if len(img.Nodes) > 0 {
			nodes = "nodes " + strings.Join(img.Nodes, ", ")
		}
		fmt.Fprintf(w, "  %s  (%s)\n", img.Set, nodes)
	}
	if len(r.Unknown) > 0 {
		fmt.Fprintf(w, "  nodes whose image is not one of these, or not recorded: %s\n", strings.Join(r.Unknown, ", "))
	}
	for _, m := range r.Measurements {
		if m.Accepted {
			fmt.Fprintf(w, "\nThe given measurements are image %s, which the cluster accepts.\n", m.Set)
		} else {
			fmt.Fprintf(w, "\nThe given measurements are image %s, which the cluster does not accept: 'orrery upgrade apply --measurements FILE' adds it.\n", m.Set)
		}
	}
	if r.UpToDate {
		fmt.Fprintln(w, "\nThe releases are current.")
	} else {
		fmt.Fprintln(w, "\nRun 'orrery upgrade apply' to upgrade (it shows the plan and asks first).")
	}
	return nil
}

type upgradeCheckOptions struct {
	kc                kubeconfigOptions
	measurementsPaths []string
	output            string
	hardware          hardwareOptions
}
