package inspect

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
)

// Rates is what a node did between two of its Usage snapshots. CPU is in
// CPUs kept busy: 1.5 on a node of 2 vCPUs is three quarters of it.
type Rates struct {
	Window time.Duration `json:"window"`
	CPUs   uint32        `json:"cpus"`
	// Busy is user, system, irq and softirq time together.
	Busy    float64 `json:"busy"`
	User    float64 `json:"user"`
	System  float64 `json:"system"`
	IRQ     float64 `json:"irq"`
	SoftIRQ float64 `json:"softirq"`
	IOWait  float64 `json:"iowait"`
	Steal   float64 `json:"steal"`
	// SwitchesPerSecond is the node's context switches.
	SwitchesPerSecond float64 `json:"switchesPerSecond"`
	// MemoryUsedBytes is total less available memory, at the end.
	MemoryUsedBytes uint64 `json:"memoryUsedBytes"`
	// KernelThreads is the CPU of the kernel's own threads, together.
	KernelThreads float64 `json:"kernelThreads"`
	// Cgroups and Processes are sorted by CPU, the busiest first.
	Cgroups   []CgroupRate  `json:"cgroups"`
	Processes []ProcessRate `json:"processes"`
}

// CgroupRate is one cgroup's CPU over the window and its memory at the end.
type CgroupRate struct {
	Path            string  `json:"path"`
	CPU             float64 `json:"cpu"`
	WorkingSetBytes uint64  `json:"workingSetBytes"`
}

// ProcessRate is one process's CPU and switches over the window. A
// process that started during it counts from its start (New); one that
// ended is not listed, though its CPU is in its cgroup's and the node's.
type ProcessRate struct {
	PID               int32   `json:"pid"`
	Name              string  `json:"name"`
	Cgroup            string  `json:"cgroup"`
	CPU               float64 `json:"cpu"`
	SwitchesPerSecond float64 `json:"switchesPerSecond"`
	RSSBytes          uint64  `json:"rssBytes"`
	Threads           uint32  `json:"threads"`
	KernelThread      bool    `json:"kernelThread,omitempty"`
	New               bool    `json:"new,omitempty"`
}

// RatesBetween compares two snapshots of one node's boot, a before b.
func RatesBetween(a, b *inspectpb.UsageResponse) (*Rates, error) {
	window := time.Duration(b.GetUptimeMicros()-a.GetUptimeMicros()) * time.Microsecond
	if window <= 0 {
		return nil, errors.New("the node's second usage snapshot is not later than its first: did it reboot between them?")
	}
	if b.GetContextSwitches() < a.GetContextSwitches() {
		return nil, errors.New("the node's counters went back between its two usage snapshots: did it reboot between them?")
	}
	us := float64(window.Microseconds())
	per := func(x, y uint64) float64 {
		if y < x {
			return 0
		}
		return float64(y-x) / us
	}
	r := &Rates{Window: window, CPUs: b.GetCpus(),
		User: per(a.GetUserMicros(), b.GetUserMicros()), System: per(a.GetSystemMicros(), b.GetSystemMicros()),
		IRQ: per(a.GetIrqMicros(), b.GetIrqMicros()), SoftIRQ: per(a.GetSoftirqMicros(), b.GetSoftirqMicros()),
		IOWait: per(a.GetIowaitMicros(), b.GetIowaitMicros()), Steal: per(a.GetStealMicros(), b.GetStealMicros()),
		SwitchesPerSecond: per(a.GetContextSwitches(), b.GetContextSwitches()) * 1e6,
	}
	r.Busy = r.User + r.System + r.IRQ + r.SoftIRQ
	if b.GetMemoryTotalBytes() > b.GetMemoryAvailableBytes() {
		r.MemoryUsedBytes = b.GetMemoryTotalBytes() - b.GetMemoryAvailableBytes()
	}
	before := map[string]uint64{}
	for _, c := range a.GetCgroups() {
		before[c.GetPath()] = c.GetCpuMicros()
	}
	for _, c := range b.GetCgroups() {
		r.Cgroups = append(r.Cgroups, CgroupRate{Path: c.GetPath(), CPU: per(before[c.GetPath()], c.GetCpuMicros()), WorkingSetBytes: c.GetWorkingSetBytes()})
	}
	type key struct {
		pid  int32
		name string
	}
	procs := map[key]*inspectpb.ProcessUsage{}
	for _, p := range a.GetProcesses() {
		procs[key{p.GetPid(), p.GetName()}] = p
	}
	for _, p := range b.GetProcesses() {
		old, seen := procs[key{p.GetPid(), p.GetName()}]
		if !seen {
			old = &inspectpb.ProcessUsage{}
		}
		pr := ProcessRate{PID: p.GetPid(), Name: p.GetName(), Cgroup: p.GetCgroup(), RSSBytes: p.GetRssBytes(), Threads: p.GetThreads(),
			KernelThread: p.GetKernelThread(), New: !seen,
			CPU:               per(old.GetCpuMicros(), p.GetCpuMicros()),
			SwitchesPerSecond: per(old.GetVoluntarySwitches()+old.GetInvoluntarySwitches(), p.GetVoluntarySwitches()+p.GetInvoluntarySwitches()) * 1e6,
		}
		if pr.KernelThread {
			r.KernelThreads += pr.CPU
		}
		r.Processes = append(r.Processes, pr)
	}
	slices.SortStableFunc(r.Cgroups, func(x, y CgroupRate) int { return cmp.Compare(y.CPU, x.CPU) })
	slices.SortStableFunc(r.Processes, func(x, y ProcessRate) int { return cmp.Compare(y.CPU, x.CPU) })
	return r, nil
}

// Process sums the CPU and switches of the processes named name (a
// program may run as several, as containerd's shims do).
func (r *Rates) Process(name string) (cpu, switches float64, n int) {
	for _, p := range r.Processes {
		if p.Name == name {
			cpu, switches, n = cpu+p.CPU, switches+p.SwitchesPerSecond, n+1
		}
	}
	return cpu, switches, n
}

// String is a one-line summary, for logs.
func (r *Rates) String() string {
	return fmt.Sprintf("%.2f of %d CPUs busy over %s (user %.2f, system %.2f, irq %.2f), %.0f switches/s",
		r.Busy, r.CPUs, r.Window.Round(time.Second), r.User, r.System, r.IRQ+r.SoftIRQ, r.SwitchesPerSecond)
}

// ServiceOrPod tells the cgroups that are a service, a scope or a pod:
// the slices above them only sum them, a pod's containers only split it.
func ServiceOrPod(path string) bool {
	base := path[strings.LastIndexByte(path, '/')+1:]
	switch {
	case strings.HasPrefix(base, "cri-containerd-"):
		return false
	case strings.Contains(base, "-pod") && strings.HasSuffix(base, ".slice"):
		return true
	}
	return strings.HasSuffix(base, ".service") || strings.HasSuffix(base, ".scope")
}
