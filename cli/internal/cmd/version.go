package cmd

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/buildinfo"
	"github.com/orrery-dev/orrery/internal/owner/charts"
	"github.com/orrery-dev/orrery/internal/owner/services"
	"github.com/orrery-dev/orrery/internal/versions"
)

// versionReport is what 'orrery version' prints.
type versionReport struct {
	Orrery buildinfo.Info `json:"orrery"`
	// Releases are the Helm releases Orrery owns, with the chart version
	// this CLI would install or upgrade them to.
	Releases           []releaseVersion `json:"releases"`
	KubernetesVersions []string         `json:"kubernetesVersions"`
}

type releaseVersion struct {
	Name         string `json:"name"`
	Namespace    string `json:"namespace"`
	Chart        string `json:"chart"`
	ChartVersion string `json:"chartVersion"`
}

func newVersionCmd() *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:   "version",
		Short: "Print the CLI's version, the charts it carries and the Kubernetes versions it supports",
		Long: `version prints this CLI's version and commit, the Helm releases Orrery owns
in a cluster with the chart version this CLI installs or upgrades them to,
and the Kubernetes versions the node image it belongs to supports.`,
		Example: `  orrery version
  orrery version -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			r, err := currentVersions()
			if err != nil {
				return err
			}
			if output != "text" {
				return writeData(cmd.OutOrStdout(), output, r)
			}
			return r.writeText(cmd.OutOrStdout())
		},
	}
	addOutputFlag(c, &output)
	describeOutput(c, versionReport{})
	return c
}

func currentVersions() (versionReport, error) {
	chartVersions, err := charts.Versions()
	if err != nil {
		return versionReport{}, err
	}
	r := versionReport{Orrery: buildinfo.Get(), KubernetesVersions: versions.List()}
	for _, o := range services.Owned {
		r.Releases = append(r.Releases, releaseVersion{Name: o.Name, Namespace: o.Namespace, Chart: o.Chart, ChartVersion: chartVersions[o.Chart]})
	}
	return r, nil
}

func (r versionReport) writeText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "orrery\t%s\n", r.Orrery)
	if r.Orrery.GoVersion != "" {
		fmt.Fprintf(tw, "built with\t%s\n", r.Orrery.GoVersion)
	}
	fmt.Fprintf(tw, "Kubernetes\t%v\n", r.KubernetesVersions)
	fmt.Fprintln(tw, "\nRELEASE\tNAMESPACE\tCHART\tVERSION")
	for _, rel := range r.Releases {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", rel.Name, rel.Namespace, rel.Chart, rel.ChartVersion)
	}
	return tw.Flush()
}
