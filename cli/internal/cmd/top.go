package cmd

import (
	"fmt"
	"io"
	"path"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/owner/inspect"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
	"github.com/orrery-dev/orrery/internal/termtext"
)

func newTopCmd() *cobra.Command {
	var cluster clusterOptions
	var output string
	var interval time.Duration
	var rows int
	c := &cobra.Command{
		Use:   "top NODE",
		Short: "Show where a node's CPU goes: per process, per cgroup, and its context switches",
		Long: `top reads a running node's CPU, memory and context-switch counters twice,
--interval apart, from the node itself over attested TLS (see 'orrery
logs'), and prints what the node did in between: its CPUs' busy time by
kind, its context switches a second, the busiest processes (kernel threads
included) and cgroups (services and pods). It works while kubelet or the
API server is down, and sees what kubelet's own statistics do not: the
processes outside the pods, and the kernel.`,
		Example: `  orrery top cp-0
  orrery top worker-0 --interval 1m --rows 30
  orrery top cp-0 -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if interval < time.Second {
				return fmt.Errorf("--interval %s: at least 1s, so that the counters move", interval)
			}
			if rows < 1 {
				return fmt.Errorf("--rows %d: at least 1", rows)
			}
			n, err := dialOne(cmd.Context(), cmd, cluster, args[0])
			if err != nil {
				return err
			}
			defer n.Close()
			first, err := n.Client.Usage(cmd.Context(), &inspectpb.UsageRequest{})
			if err != nil {
				return termtext.Error(err)
			}
			// On stderr with every output format: a script that times the
			// same window from outside starts its clock here.
			fmt.Fprintf(cmd.ErrOrStderr(), "Read %s's counters; reading them again in %s...\n", termtext.Line(args[0]), interval)
			select {
			case <-time.After(interval):
			case <-cmd.Context().Done():
				return cmd.Context().Err()
			}
			second, err := n.Client.Usage(cmd.Context(), &inspectpb.UsageRequest{})
			if err != nil {
				return termtext.Error(err)
			}
			r, err := inspect.RatesBetween(first, second)
			if err != nil {
				return err
			}
			if output != "text" {
				return writeData(cmd.OutOrStdout(), output, r)
			}
			return writeRates(cmd.OutOrStdout(), r, rows)
		},
	}
	c.Flags().DurationVar(&interval, "interval", 10*time.Second, "how long to watch the node")
	c.Flags().IntVar(&rows, "rows", 15, "how many processes and cgroups to show (text output)")
	addOutputFlag(c, &output)
	describeOutput(c, inspect.Rates{})
	addClusterFlags(c.Flags(), &cluster, 2*time.Minute)
	return c
}

// writeRates prints the node's line, then its busiest processes and
// cgroups. Names come from the node: each is escaped to stay in its cell.
func writeRates(w io.Writer, r *inspect.Rates, rows int) error {
	fmt.Fprintf(w, "Over %s: %.2f of %d CPUs busy (user %.2f, system %.2f, irq %.2f; kernel threads %.2f), %.0f context switches/s, %.0f MiB in use\n\n",
		r.Window.Round(time.Millisecond), r.Busy, r.CPUs, r.User, r.System, r.IRQ+r.SoftIRQ, r.KernelThreads, r.SwitchesPerSecond, float64(r.MemoryUsedBytes)/(1<<20))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "PID\tCPU\tSWITCHES/S\tRSS MiB\tTHREADS\tNAME\t GROUP\t")
	for _, p := range r.Processes[:min(rows, len(r.Processes))] {
		name := termtext.Line(p.Name)
		if p.KernelThread {
			name = "[" + name + "]"
		}
		fmt.Fprintf(tw, "%d\t%.3f\t%.0f\t%.0f\t%d\t%s\t %s\t\n", p.PID, p.CPU, p.SwitchesPerSecond, float64(p.RSSBytes)/(1<<20), p.Threads, name, termtext.Line(shortGroup(p.Cgroup)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "CPU\tWORKING SET MiB\t CGROUP\t")
	shown := 0
	for _, c := range r.Cgroups {
		if shown == rows {
			break
		}
		if !inspect.ServiceOrPod(c.Path) {
			continue
		}
		shown++
		fmt.Fprintf(tw, "%.3f\t%.0f\t %s\t\n", c.CPU, float64(c.WorkingSetBytes)/(1<<20), termtext.Line(c.Path))
	}
	return tw.Flush()
}

// shortGroup names a process's cgroup for a narrow column: a service by
// its unit, a container by its pod's cgroup.
func shortGroup(cg string) string {
	if cg == "" {
		return "-"
	}
	base := path.Base(cg)
	if strings.HasPrefix(base, "cri-containerd-") {
		return "pod " + strings.TrimSuffix(strings.TrimPrefix(path.Base(path.Dir(cg)), "kubepods-"), ".slice")
	}
	return base
}
