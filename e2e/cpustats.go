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
		CPU              cpuStats `json:"cpu"`
		SystemContainers []struct {
			Name string   `json:"name"`
			CPU  cpuStats `json:"cpu"`
		} `json:"systemContainers"`
	} `json:"node"`
	Pods []struct {
		PodRef struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"podRef"`
		CPU cpuStats `json:"cpu"`
	} `json:"pods"`
}

type cpuStats struct {
	UsageNanoCores       uint64 `json:"usageNanoCores"`
	UsageCoreNanoSeconds uint64 `json:"usageCoreNanoSeconds"`
}

// cpuTable renders where a node's CPU goes, from kubelet's stats summary:
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
	}
	var rows []row
	for _, c := range s.Node.SystemContainers {
		rows = append(rows, row{"(" + c.Name + ")", cores(c.CPU.UsageNanoCores), seconds(c.CPU.UsageCoreNanoSeconds)})
	}
	for _, p := range s.Pods {
		rows = append(rows, row{p.PodRef.Namespace + "/" + p.PodRef.Name, cores(p.CPU.UsageNanoCores), seconds(p.CPU.UsageCoreNanoSeconds)})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].now > rows[j].now })
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CGROUP\tCORES NOW\tCPU SECONDS SO FAR")
	fmt.Fprintf(w, "node\t%.3f\t%.0f\n", cores(s.Node.CPU.UsageNanoCores), seconds(s.Node.CPU.UsageCoreNanoSeconds))
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%.3f\t%.0f\n", r.name, r.now, r.total)
	}
	w.Flush()
	return b.String(), nil
}

func cores(nano uint64) float64   { return float64(nano) / 1e9 }
func seconds(nano uint64) float64 { return float64(nano) / 1e9 }
