package cmd

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
	"github.com/orrery-dev/orrery/internal/termtext"
)

func newServicesCmd() *cobra.Command {
	var cluster clusterOptions
	var output string
	c := &cobra.Command{
		Use:   "services NODE [PATTERN]",
		Short: "Show the state of a node's systemd units",
		Long: `services lists a running node's systemd units with their states, as
'systemctl list-units' shows them, read from the node itself over attested
TLS (see 'orrery logs'): it works while kubelet or the API server is down.
PATTERN limits the list ("kube*", "containerd.service"); without it, every
unit the node has loaded is shown.`,
		Example: `  orrery services cp-0
  orrery services worker-0 'kube*'
  orrery services 10.42.1.10 -o yaml`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			pattern := ""
			if len(args) == 2 {
				pattern = args[1]
			}
			n, err := dialOne(cmd.Context(), cmd, cluster, args[0])
			if err != nil {
				return err
			}
			defer n.Close()
			resp, err := n.Client.Units(cmd.Context(), &inspectpb.UnitsRequest{Pattern: pattern})
			if err != nil {
				return termtext.Error(err)
			}
			units := make([]unitState, 0, len(resp.GetUnits()))
			for _, u := range resp.GetUnits() {
				units = append(units, unitOf(u))
			}
			if output != "text" {
				return writeData(cmd.OutOrStdout(), output, units)
			}
			return writeUnits(cmd.OutOrStdout(), units)
		},
	}
	addOutputFlag(c, &output)
	describeOutput(c, []unitState{})
	addClusterFlags(c.Flags(), &cluster, 2*time.Minute)
	return c
}

// unitState is a unit as the owner reads it.
type unitState struct {
	Name        string     `json:"name"`
	Description string     `json:"description"`
	Load        string     `json:"load"`
	Active      string     `json:"active"`
	Sub         string     `json:"sub"`
	Since       *time.Time `json:"since,omitempty"`
	MainPID     uint32     `json:"mainPID,omitempty"`
	Restarts    uint32     `json:"restarts,omitempty"`
	Result      string     `json:"result,omitempty"`
}

func unitOf(u *inspectpb.Unit) unitState {
	s := unitState{Name: u.GetName(), Description: u.GetDescription(), Load: u.GetLoadState(), Active: u.GetActiveState(),
		Sub: u.GetSubState(), MainPID: u.GetMainPid(), Restarts: u.GetRestarts(), Result: u.GetResult()}
	if t := u.GetSinceUnixMicros(); t != 0 {
		since := time.UnixMicro(t).UTC()
		s.Since = &since
	}
	return s
}

// writeUnits prints one unit a line: the node names and describes its
// units, so each field is escaped to stay in its cell.
func writeUnits(w io.Writer, units []unitState) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "UNIT\tLOAD\tACTIVE\tSUB\tSINCE\tRESTARTS\tRESULT\tDESCRIPTION")
	for _, u := range units {
		since := "-"
		if u.Since != nil {
			since = u.Since.Format(time.RFC3339)
		}
		result := u.Result
		if result == "" {
			result = "-"
		}
		l := termtext.Line
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", l(u.Name), l(u.Load), l(u.Active), l(u.Sub), since, u.Restarts, l(result), l(u.Description))
	}
	return tw.Flush()
}
