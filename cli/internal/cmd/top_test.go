package cmd

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/owner/inspect"
)

// The node names its processes and cgroups: what it says stays in its
// cell, with no terminal control character.
func TestWriteRatesEscapesWhatTheNodeNames(t *testing.T) {
	r := &inspect.Rates{Window: 10 * time.Second, CPUs: 2, Busy: 1.5, SwitchesPerSecond: 4000,
		Processes: []inspect.ProcessRate{
			{PID: 7, Name: "evil\x1b[2J\nline", Cgroup: "system.slice/x\x07.service", CPU: 0.5},
			{PID: 8, Name: "kube-apiserver", Cgroup: "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podabc.slice/cri-containerd-1.scope", CPU: 0.4},
			{PID: 2, Name: "kthreadd", KernelThread: true},
		},
		Cgroups: []inspect.CgroupRate{{Path: "system.slice", CPU: 0.9}, {Path: "system.slice/kubelet.service", CPU: 0.3}},
	}
	var b bytes.Buffer
	if err := writeRates(&b, r, 10); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.ContainsAny(out, "\x1b\x07") || strings.Contains(out, "\nline") {
		t.Fatalf("control characters from the node reached the terminal:\n%q", out)
	}
	for _, want := range []string{"1.50 of 2 CPUs busy", "4000 context switches/s", "pod burstable-podabc", "[kthreadd]", "system.slice/kubelet.service"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// A slice sums what is below it: only the leaves are listed.
	for _, line := range strings.Split(out, "\n") {
		if strings.HasSuffix(strings.TrimSpace(line), " system.slice") {
			t.Errorf("the slice itself is listed: %q", line)
		}
	}
}
