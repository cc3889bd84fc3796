package inspect

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestRatesBetweenTwoSnapshots(t *testing.T) {
	a := &inspectpb.UsageResponse{UptimeMicros: 100e6, Cpus: 2, UserMicros: 1e6, SystemMicros: 1e6, ContextSwitches: 1000,
		Cgroups: []*inspectpb.CgroupUsage{{Path: "system.slice/kubelet.service", CpuMicros: 5e6}},
		Processes: []*inspectpb.ProcessUsage{
			{Pid: 10, Name: "kubelet", CpuMicros: 4e6, VoluntarySwitches: 100},
			{Pid: 11, Name: "etcd", CpuMicros: 9e6},
			{Pid: 12, Name: "gone", CpuMicros: 1e6},
		}}
	b := &inspectpb.UsageResponse{UptimeMicros: 110e6, Cpus: 2, UserMicros: 9e6, SystemMicros: 3e6, IrqMicros: 1e6, ContextSwitches: 41000,
		MemoryTotalBytes: 3 << 30, MemoryAvailableBytes: 2 << 30,
		Cgroups: []*inspectpb.CgroupUsage{{Path: "system.slice/kubelet.service", CpuMicros: 8e6, WorkingSetBytes: 7}, {Path: "new.slice", CpuMicros: 1e6}},
		Processes: []*inspectpb.ProcessUsage{
			{Pid: 10, Name: "kubelet", CpuMicros: 7e6, VoluntarySwitches: 150, InvoluntarySwitches: 50},
			{Pid: 11, Name: "etcd", CpuMicros: 14e6},
			// A new process that took pid 12: its CPU counts from its start.
			{Pid: 12, Name: "shim", CpuMicros: 2e6},
			{Pid: 2, Name: "kworker", CpuMicros: 1e5, KernelThread: true},
		}}
	r, err := RatesBetween(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if r.Window != 10*time.Second || !near(r.User, 0.8) || !near(r.System, 0.2) || !near(r.Busy, 1.1) || !near(r.SwitchesPerSecond, 4000) || r.MemoryUsedBytes != 1<<30 {
		t.Errorf("node: %+v", r)
	}
	if r.Cgroups[0].Path != "system.slice/kubelet.service" || !near(r.Cgroups[0].CPU, 0.3) || r.Cgroups[0].WorkingSetBytes != 7 || !near(r.Cgroups[1].CPU, 0.1) {
		t.Errorf("cgroups: %+v", r.Cgroups)
	}
	if p := r.Processes[0]; p.Name != "etcd" || !near(p.CPU, 0.5) || p.New {
		t.Errorf("busiest: %+v", p)
	}
	if p := r.Processes[1]; p.Name != "kubelet" || !near(p.CPU, 0.3) || !near(p.SwitchesPerSecond, 10) {
		t.Errorf("kubelet: %+v", p)
	}
	if p := r.Processes[2]; p.Name != "shim" || !near(p.CPU, 0.2) || !p.New {
		t.Errorf("a process that took an ended one's pid: %+v", p)
	}
	if !near(r.KernelThreads, 0.01) {
		t.Errorf("kernel threads: %v", r.KernelThreads)
	}
	if cpu, _, n := r.Process("etcd"); n != 1 || !near(cpu, 0.5) {
		t.Errorf("Process(etcd): %v, %d", cpu, n)
	}
}

// Snapshots of two boots cannot be compared: the counters started over.
func TestRatesRefuseSnapshotsOfTwoBoots(t *testing.T) {
	later := &inspectpb.UsageResponse{UptimeMicros: 500e6, ContextSwitches: 9000}
	rebooted := &inspectpb.UsageResponse{UptimeMicros: 20e6, ContextSwitches: 100}
	for name, tc := range map[string][2]*inspectpb.UsageResponse{
		"uptime went back":   {later, rebooted},
		"same instant":       {later, later},
		"switches went back": {later, {UptimeMicros: 600e6, ContextSwitches: 5}},
	} {
		if _, err := RatesBetween(tc[0], tc[1]); err == nil || !strings.Contains(err.Error(), "reboot") {
			t.Errorf("%s: %v, want an error that names a reboot", name, err)
		}
	}
}

func TestServiceOrPod(t *testing.T) {
	for path, want := range map[string]bool{
		"system.slice":                            false,
		"system.slice/kubelet.service":            true,
		"init.scope":                              true,
		"kubepods.slice":                          false,
		"kubepods.slice/kubepods-burstable.slice": false,
		"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice":                        true,
		"kubepods.slice/kubepods-pod2.slice":                                                           true,
		"kubepods.slice/kubepods-pod2.slice/cri-containerd-abc.scope":                                  false,
		"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-x.scope": false,
	} {
		if got := ServiceOrPod(path); got != want {
			t.Errorf("ServiceOrPod(%q) = %v, want %v", path, got, want)
		}
	}
}
