package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/cloud/loadbalancer"
)

func newMiniStatusCmd() *cobra.Command {
	var dir, output string
	c := &cobra.Command{
		Use:     "status",
		Short:   "Show the local cloud's VMs, roles, addresses and uptime",
		Long:    "status lists the local cloud's VMs: their roles, addresses, state, uptime and console logs, and which control planes its load balancer sends connections to.",
		Example: "  orrery mini status\n  orrery mini status -o jsonpath='{.nodes[*].ip}'",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			st, err := cloud.ReadState(dir)
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("no local cloud in %s: start one with '%sorrery mini up'", dir, sudoPrefix(os.Geteuid(), os.Getenv("SUDO_USER")))
			}
			if err != nil {
				return err
			}
			if output != "text" {
				return writeData(cmd.OutOrStdout(), output, newMiniReport(st))
			}
			printNodes(cmd.OutOrStdout(), st)
			printLoadBalancer(cmd, dir, st)
			return nil
		},
	}
	addDirFlag(c, &dir)
	addOutputFlag(c, &output)
	describeOutput(c, miniReport{})
	return c
}

// miniReport is 'mini status' as data.
type miniReport struct {
	// Phase is starting, up or stopped.
	Phase       string         `json:"phase"`
	Accelerator string         `json:"accelerator"`
	Started     time.Time      `json:"started"`
	Stopped     time.Time      `json:"stopped,omitzero"`
	Nodes       []miniNodeInfo `json:"nodes"`
}

type miniNodeInfo struct {
	Name          string `json:"name"`
	Role          string `json:"role"`
	IP            string `json:"ip"`
	Running       bool   `json:"running"`
	UptimeSeconds int64  `json:"uptimeSeconds"`
	SerialLog     string `json:"serialLog"`
}

func newMiniReport(st cloud.State) miniReport {
	r := miniReport{Phase: st.Phase, Accelerator: fmt.Sprint(st.Accel), Started: st.Started.UTC(), Nodes: []miniNodeInfo{}}
	if !st.Stopped.IsZero() {
		r.Stopped = st.Stopped.UTC()
	}
	for _, n := range st.Nodes {
		d, running := n.Uptime()
		r.Nodes = append(r.Nodes, miniNodeInfo{Name: n.Name, Role: string(n.Role), IP: n.IP.String(), Running: running, UptimeSeconds: int64(d.Seconds()), SerialLog: n.SerialLog()})
	}
	return r
}

// printLoadBalancer says which control planes the cloud's load balancer
// sends connections to.
func printLoadBalancer(cmd *cobra.Command, dir string, st cloud.State) {
	if st.Phase != cloud.PhaseUp || !st.Endpoint.IsValid() {
		return
	}
	out := cmd.OutOrStdout()
	ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
	defer cancel()
	servers, err := loadbalancer.ServersIn(ctx, filepath.Join(dir, cloud.LoadBalancerDir))
	if err != nil {
		fmt.Fprintf(out, "\nLoad balancer %s: no answer (%v)\n", st.Endpoint.Addr(), err)
		return
	}
	fmt.Fprintf(out, "\nLoad balancer %s, the cluster's endpoint:\n", st.Endpoint.Addr())
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "PORT\tCONTROL PLANE\tCHECK")
	for _, s := range servers {
		fmt.Fprintf(w, "%d\t%s\t%s\n", s.Port, s.Name, s.Status)
	}
	w.Flush()
}

func printNodes(out io.Writer, st cloud.State) {
	if st.Phase == cloud.PhaseStopped {
		fmt.Fprintf(out, "\nStopped %s, disks kept: 'orrery mini start' boots the VMs again\n", st.Stopped.Format(time.RFC3339))
	} else {
		fmt.Fprintf(out, "\nAccelerator: %s; started %s\n", st.Accel, st.Started.Format(time.RFC3339))
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tROLE\tIP\tSTATE\tUPTIME\tSERIAL LOG")
	for _, n := range st.Nodes {
		state, uptime := "stopped", "-"
		if d, ok := n.Uptime(); ok {
			state, uptime = "running", d.Round(time.Second).String()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Role, n.IP, state, uptime, n.SerialLog())
	}
	w.Flush()
}
