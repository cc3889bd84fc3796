package inspectserver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeTree writes files (path relative to root: content) under root.
func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, data := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// A node as /proc and the cgroup tree show it: one Go daemon with two
// threads and a command name that has spaces and a parenthesis, one
// kernel thread, a service's cgroup and a pod's below kubepods.
func TestUsageReadsTheNodesCounters(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"proc/uptime":            "1234.56 2000.00\n",
		"proc/stat":              "cpu  100 20 300 4000 5 6 7 8 0 0\ncpu0 50 10 150 2000 2 3 3 4 0 0\ncpu1 50 10 150 2000 3 3 4 4 0 0\nintr 1 2\nctxt 987654\nbtime 1\n",
		"proc/meminfo":           "MemTotal:        3000000 kB\nMemFree:          100 kB\nMemAvailable:    2000000 kB\n",
		"proc/42/stat":           "42 (kube (api) x) S 1 42 42 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 2 0 500 1000000 2048 18446744073709551615\n",
		"proc/42/cgroup":         "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-a.scope\n",
		"proc/42/task/42/status": "Name:\tkube\nvoluntary_ctxt_switches:\t10\nnonvoluntary_ctxt_switches:\t1\n",
		"proc/42/task/43/status": "Name:\tkube\nvoluntary_ctxt_switches:\t32\nnonvoluntary_ctxt_switches:\t4\n",
		"proc/2/stat":            "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 3 0 0 20 0 1 0 2 0 0 18446744073709551615\n",
		"proc/self/stat":         "not a pid directory",
		"sys/fs/cgroup/cpu.stat": "usage_usec 1\n",
		"sys/fs/cgroup/system.slice/kubelet.service/cpu.stat":                                                                 "usage_usec 5000000\nuser_usec 3000000\n",
		"sys/fs/cgroup/system.slice/kubelet.service/memory.current":                                                           "104857600\n",
		"sys/fs/cgroup/system.slice/kubelet.service/memory.stat":                                                              "anon 1\ninactive_file 4857600\n",
		"sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-a.scope/cpu.stat": "usage_usec 7\n",
	})
	u, err := Usage{Root: root}.Read()
	if err != nil {
		t.Fatal(err)
	}
	if u.GetUptimeMicros() != 1234560000 || u.GetCpus() != 2 || u.GetContextSwitches() != 987654 {
		t.Errorf("uptime %d µs, %d CPUs, %d switches", u.GetUptimeMicros(), u.GetCpus(), u.GetContextSwitches())
	}
	// /proc/stat counts in hundredths of a second; user includes nice.
	if u.GetUserMicros() != 1200000 || u.GetSystemMicros() != 3000000 || u.GetIdleMicros() != 40000000 || u.GetStealMicros() != 80000 {
		t.Errorf("CPU times: user %d, system %d, idle %d, steal %d", u.GetUserMicros(), u.GetSystemMicros(), u.GetIdleMicros(), u.GetStealMicros())
	}
	if u.GetMemoryTotalBytes() != 3000000<<10 || u.GetMemoryAvailableBytes() != 2000000<<10 {
		t.Errorf("memory: %d of %d", u.GetMemoryAvailableBytes(), u.GetMemoryTotalBytes())
	}
	byPath := map[string]int{}
	for i, c := range u.GetCgroups() {
		byPath[c.GetPath()] = i
	}
	kubelet, ok := byPath["system.slice/kubelet.service"]
	if !ok {
		t.Fatalf("no kubelet cgroup in %v", u.GetCgroups())
	}
	if c := u.GetCgroups()[kubelet]; c.GetCpuMicros() != 5000000 || c.GetMemoryBytes() != 104857600 || c.GetWorkingSetBytes() != 100000000 {
		t.Errorf("kubelet's cgroup: %v", c)
	}
	if _, ok := byPath["kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-a.scope"]; !ok {
		t.Errorf("a pod's container, four levels down, is missing: %v", byPath)
	}
	if len(u.GetProcesses()) != 2 {
		t.Fatalf("processes: %v", u.GetProcesses())
	}
	for _, p := range u.GetProcesses() {
		switch p.GetPid() {
		case 42:
			if p.GetName() != "kube (api) x" || p.GetCpuMicros() != 4000000 || p.GetThreads() != 2 || p.GetKernelThread() ||
				p.GetVoluntarySwitches() != 42 || p.GetInvoluntarySwitches() != 5 || p.GetRssBytes() != 2048*uint64(os.Getpagesize()) ||
				!strings.HasSuffix(p.GetCgroup(), "cri-containerd-a.scope") || strings.HasPrefix(p.GetCgroup(), "/") {
				t.Errorf("the daemon: %v", p)
			}
		case 2:
			if !p.GetKernelThread() || p.GetCpuMicros() != 30000 {
				t.Errorf("the kernel thread: %v", p)
			}
		}
	}
}

// The node's own counters are required: without them there is nothing
// to compare, and the answer says which file failed.
func TestUsageRefusesBrokenNodeFiles(t *testing.T) {
	good := map[string]string{
		"proc/uptime":  "10.0 1.0\n",
		"proc/stat":    "cpu  1 2 3 4 5 6 7 8\ncpu0 1 2 3 4 5 6 7 8\nctxt 5\n",
		"proc/meminfo": "MemTotal: 1 kB\n",
	}
	for name, tc := range map[string]struct{ file, data, want string }{
		"no uptime":        {"proc/uptime", "", "uptime"},
		"garbage uptime":   {"proc/uptime", "soon", "uptime"},
		"short cpu line":   {"proc/stat", "cpu 1 2 3\n", "fields"},
		"no cpu line":      {"proc/stat", "ctxt 5\n", "no cpu line"},
		"garbage cpu time": {"proc/stat", "cpu  1 2 x 4 5 6 7 8\n", "CPU times"},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			writeTree(t, root, good)
			writeTree(t, root, map[string]string{tc.file: tc.data})
			if _, err := (Usage{Root: root}).Read(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error about %q", err, tc.want)
			}
		})
	}
}

// On this machine's own /proc: the test's process is there with the CPU
// it used, and its threads' switches are summed.
func TestUsageReadsThisMachine(t *testing.T) {
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	u, err := Usage{}.Read()
	if err != nil {
		t.Fatal(err)
	}
	if u.GetCpus() == 0 || u.GetContextSwitches() == 0 || u.GetMemoryTotalBytes() == 0 {
		t.Fatalf("the node: %d CPUs, %d switches, %d bytes", u.GetCpus(), u.GetContextSwitches(), u.GetMemoryTotalBytes())
	}
	for _, p := range u.GetProcesses() {
		if int(p.GetPid()) == os.Getpid() {
			if p.GetCpuMicros() == 0 || p.GetThreads() < 2 || p.GetVoluntarySwitches()+p.GetInvoluntarySwitches() == 0 || p.GetKernelThread() {
				t.Fatalf("this test's process: %v", p)
			}
			return
		}
	}
	t.Fatalf("this test's process (%d) is not among %d", os.Getpid(), len(u.GetProcesses()))
}

func TestParseProcStatRefusesGarbage(t *testing.T) {
	for name, in := range map[string]string{
		"empty":          "",
		"no parentheses": "42 kube S 1",
		"no pid":         "(kube) S 1 2 3",
		"negative pid":   "-4 (kube) S 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0",
		"too few fields": "42 (kube) S 1 42",
		"garbage field":  "42 (kube) S 1 42 42 0 -1 x 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0",
		"garbage rss":    "42 (kube) S 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 z",
		"closing first":  "42 )kube( S 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0",
	} {
		if p, err := ParseProcStat([]byte(in)); err == nil {
			t.Errorf("%s: parsed %v", name, p)
		}
	}
}

func FuzzParseProcStat(f *testing.F) {
	f.Add([]byte("42 (kube (api) x) S 1 42 42 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 2 0 500 1000000 2048 18446744073709551615\n"))
	f.Add([]byte("2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 3 0 0 20 0 1 0 2 0 0 18446744073709551615\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseProcStat(b)
		if err != nil {
			return
		}
		if p.GetPid() <= 0 || len(p.GetName()) > 64 {
			t.Fatalf("parsed %v from %q", p, b)
		}
	})
}
