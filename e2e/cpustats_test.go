//go:build e2e

package e2e

import (
	"strings"
	"testing"
)

func TestCPUTable(t *testing.T) {
	const stats = `{"node":{"cpu":{"usageNanoCores":1663219446,"usageCoreNanoSeconds":3000000000000},
	"systemContainers":[{"name":"kubelet","cpu":{"usageNanoCores":423124852,"usageCoreNanoSeconds":611176575000}}]},
	"pods":[{"podRef":{"namespace":"kube-system","name":"etcd-cp-0"},"cpu":{"usageNanoCores":196000000,"usageCoreNanoSeconds":303500000000},"memory":{"workingSetBytes":104857600}},
	{"podRef":{"namespace":"kube-system","name":"kube-apiserver-cp-0"},"cpu":{"usageNanoCores":334000000,"usageCoreNanoSeconds":604800000000}}]}`
	table, err := cpuTable([]byte(stats))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(table), "\n")
	want := []string{"CGROUP", "node ", "(kubelet)", "kube-system/kube-apiserver-cp-0", "kube-system/etcd-cp-0"}
	if len(lines) != len(want) {
		t.Fatalf("table has %d lines, want %d:\n%s", len(lines), len(want), table)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d = %q, want it to start with %q (busiest first)", i, lines[i], w)
		}
	}
	if !strings.Contains(lines[1], "1.663") || !strings.Contains(lines[3], "0.334") || !strings.Contains(lines[3], "605") {
		t.Errorf("numbers not rendered as cores and CPU seconds:\n%s", table)
	}
	if !strings.Contains(lines[4], "100") {
		t.Errorf("etcd's working set not rendered in MiB:\n%s", table)
	}
	if _, err := cpuTable([]byte("Unable to connect to the server")); err == nil {
		t.Error("garbage parsed without error")
	}
}
