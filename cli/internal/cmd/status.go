package cmd

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/owner/clusterstatus"
	"github.com/orrery-dev/orrery/internal/termtext"
)

func newStatusCmd() *cobra.Command {
	var (
		kc     kubeconfigOptions
		output string
	)
	c := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster's nodes, the images they run, and Orrery's services",
		Long: `status lists the cluster's nodes with their roles, readiness, Kubernetes
version and the node image (measurement set) each attested with when it
joined or last rejoined, and Orrery's Helm releases with their chart
versions and health, and says whether this orrery carries newer charts
('orrery upgrade check' tells more).`,
		Example: `  orrery status
  orrery status --kubeconfig orrery-admin.conf -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			cluster, cleanup, err := kc.connect(cmd.Context(), workspaceDir(cmd))
			if err != nil {
				return err
			}
			defer cleanup()
			r, err := clusterstatus.Get(cmd.Context(), cluster)
			if err != nil {
				return err
			}
			if output != "text" {
				return writeData(cmd.OutOrStdout(), output, r)
			}
			return writeStatus(cmd.OutOrStdout(), r)
		},
	}
	addKubeconfigFlags(c.Flags(), &kc)
	addOutputFlag(c, &output)
	describeOutput(c, clusterstatus.Report{})
	return c
}

func writeStatus(w io.Writer, r clusterstatus.Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tROLES\tREADY\tVERSION\tIMAGE")
	for _, n := range r.Nodes {
		roles, image := strings.Join(n.Roles, ","), n.Image
		if roles == "" {
			roles = "<none>"
		}
		if image == "" {
			image = "<not recorded>"
		}
		// A kubelet writes its own Node: its version and labels are its word.
		l := termtext.Line
		fmt.Fprintf(tw, "%s\t%s\t%t\t%s\t%s\n", l(n.Name), l(roles), n.Ready, l(n.KubeletVersion), l(image))
	}
	fmt.Fprintln(tw, "\nRELEASE\tNAMESPACE\tCHART\tREVISION\tSTATUS\tHEALTHY\tAVAILABLE")
	for _, rel := range r.Releases {
		available := rel.Available
		if !rel.Behind {
			available = "current"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%t\t%s\n", rel.Name, rel.Namespace, rel.ChartVersion, rel.Revision, rel.Status, rel.Healthy, available)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, rel := range r.Releases {
		for _, p := range rel.Problems {
			fmt.Fprintf(w, "  %s: %s\n", rel.Name, termtext.Line(p))
		}
	}
	if r.Behind {
		fmt.Fprintln(w, "\nThis orrery carries changes for the cluster's releases: see 'orrery upgrade check'.")
	}
	return nil
}
