//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
)

// summary is the part of kubelet's /stats/summary the suite reads.
type summary struct {
	Node struct {
		CPU              cpuStats    `json:"cpu"`
		Memory           memoryStats `json:"memory"`
		SystemContainers []struct {
			Name   string      `json:"name"`
			CPU    cpuStats    `json:"cpu"`
			Memory memoryStats `json:"memory"`
		} `json:"systemContainers"`
	} `json:"node"`
	Pods []struct {
		PodRef struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"podRef"`
		CPU    cpuStats    `json:"cpu"`
		Memory memoryStats `json:"memory"`
	} `json:"pods"`
}

// memoryStats is a cgroup's memory: its working set is what the kernel
// cannot take back without swapping (kubelet evicts by it).
type memoryStats struct {
	WorkingSetBytes uint64 `json:"workingSetBytes"`
}

type cpuStats struct {
	UsageNanoCores       uint64 `json:"usageNanoCores"`
	UsageCoreNanoSeconds uint64 `json:"usageCoreNanoSeconds"`
}

// cpuTable renders where a node's CPU and memory go, from kubelet's stats summary:
// the node, kubelet's and the runtime's own cgroups, and each pod, the
// busiest first. Under emulation an idle control plane keeps its vCPUs
// busy, and this is what says by what.
func cpuTable(summaryJSON []byte) (string, error) {
	var s summary
	if err := json.Unmarshal(summaryJSON, &s); err != nil {
		return "", fmt.Errorf("parse kubelet's stats summary: %w", err)
	}
	type row struct {
		name       string
		now, total float64
		mib        float64
	}
	var rows []row
	for _, c := range s.Node.SystemContainers {
		rows = append(rows, row{"(" + c.Name + ")", cores(c.CPU.UsageNanoCores), seconds(c.CPU.UsageCoreNanoSeconds), mib(c.Memory.WorkingSetBytes)})
	}
	for _, p := range s.Pods {
		rows = append(rows, row{p.PodRef.Namespace + "/" + p.PodRef.Name, cores(p.CPU.UsageNanoCores), seconds(p.CPU.UsageCoreNanoSeconds), mib(p.Memory.WorkingSetBytes)})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].now > rows[j].now })
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CGROUP\tCORES NOW\tCPU SECONDS SO FAR\tMEMORY MiB (WORKING SET)")
	fmt.Fprintf(w, "node\t%.3f\t%.0f\t%.0f\n", cores(s.Node.CPU.UsageNanoCores), seconds(s.Node.CPU.UsageCoreNanoSeconds), mib(s.Node.Memory.WorkingSetBytes))
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%.3f\t%.0f\t%.0f\n", r.name, r.now, r.total, r.mib)
	}
	w.Flush()
	return b.String(), nil
}

func cores(nano uint64) float64   { return float64(nano) / 1e9 }
func mib(bytes uint64) float64    { return float64(bytes) / (1 << 20) }
func seconds(nano uint64) float64 { return float64(nano) / 1e9 }
