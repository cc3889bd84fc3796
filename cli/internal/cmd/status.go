package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/owner/clusterstatus"
	"github.com/orrery-dev/orrery/internal/owner/kubeupgrade"
	"github.com/orrery-dev/orrery/internal/termtext"
)

func newStatusCmd() *cobra.Command {
	var (
		cluster clusterOptions
		output  string
	)
	c := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster's nodes, the images they run, and Orrery's services",
		Long: `status lists the cluster's nodes with their roles, readiness, Kubernetes
version and the node image (measurement set) each attested with when it
joined or last rejoined, the control planes' endpoint and etcd's members
with their health, and Orrery's Helm releases with their chart versions
and health, and says whether this orrery carries newer charts ('orrery
upgrade check' tells more).

etcd's members come from a control plane, over attested TLS, as the owner:
that needs the master secret (--master-secret, or the workspace's). Without
it, status shows the rest.`,
		Example: `  orrery status
  orrery status --kubeconfig orrery-admin.conf -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			c, cleanup, err := cluster.kc.connect(cmd.Context(), workspaceDir(cmd))
			if err != nil {
				return err
			}
			defer cleanup()
			r, err := clusterstatus.Get(cmd.Context(), c)
			if err != nil {
				return err
			}
			r.Etcd = askEtcd(cmd, &cluster, r.Nodes)
			if output != "text" {
				return writeData(cmd.OutOrStdout(), output, r)
			}
			return writeStatus(cmd.OutOrStdout(), r)
		},
	}
	addClusterFlags(c.Flags(), &cluster, 30*time.Second)
	addOutputFlag(c, &output)
	describeOutput(c, clusterstatus.Report{})
	return c
}

// askEtcd asks the control planes in turn for etcd's members, as the
// owner; nil if the owner's master secret is not at hand.
func askEtcd(cmd *cobra.Command, cluster *clusterOptions, nodes []clusterstatus.Node) *clusterstatus.Etcd {
	own, err := cluster.owner(cmd, nil)
	if err != nil {
		if errors.Is(err, errNoMasterSecret) {
			return nil
		}
		return &clusterstatus.Etcd{Error: err.Error()}
	}
	var errs []string
	for _, n := range nodes {
		if !slices.Contains(n.Roles, "control-plane") || n.Address == "" {
			continue
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), cluster.timeout)
		members, err := func() ([]kubeupgrade.EtcdMember, error) {
			r, err := kubeupgrade.DialNode(ctx, own, n.Name, n.Address)
			if err != nil {
				return nil, err
			}
			defer r.Close()
			return r.EtcdMembers(ctx)
		}()
		cancel()
		if err == nil {
			return &clusterstatus.Etcd{From: n.Name, Members: members}
		}
		errs = append(errs, n.Name+": "+err.Error())
	}
	if len(errs) == 0 {
		errs = append(errs, "the cluster lists no control plane with an address")
	}
	return &clusterstatus.Etcd{Error: "no control plane answered: " + strings.Join(errs, "; ")}
}

func writeStatus(w io.Writer, r clusterstatus.Report) error {
	fmt.Fprintf(w, "Control-plane endpoint: %s\n\n", termtext.Line(r.Endpoint))
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
	writeEtcd(tw, r.Etcd)
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

// writeEtcd adds etcd's members to the table.
func writeEtcd(tw io.Writer, e *clusterstatus.Etcd) {
	if e == nil {
		fmt.Fprintln(tw, "\netcd's members: not asked (without the master secret, the owner cannot ask a control plane)")
		return
	}
	if e.Error != "" {
		fmt.Fprintf(tw, "\netcd's members: %s\n", termtext.Line(e.Error))
		return
	}
	fmt.Fprintf(tw, "\nETCD MEMBER\tID\tVOTES\tHEALTHY\tLEADER\tRAFT INDEX\t(as %s sees it)\n", e.From)
	for _, m := range e.Members {
		name := m.Name
		if name == "" {
			name = "<not started>"
		}
		health := "yes"
		if !m.Healthy {
			health = "no: " + m.Error
		}
		fmt.Fprintf(tw, "%s\t%x\t%t\t%s\t%t\t%d\t\n", name, m.ID, !m.Learner, health, m.Leader, m.RaftIndex)
	}
}
