//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/inspectserver"
	"github.com/orrery-dev/orrery/internal/owner/inspect"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
)

var (
	idleWorkers = flag.Int("idle-workers", 0, "idle set: how many workers beside the control plane")
	idleSettle  = flag.Duration("idle-settle", 3*time.Minute, "idle set: how long the cluster rests, every node and kube-system pod Ready, before the window")
	idleWindow  = flag.Duration("idle-window", 10*time.Minute, "idle set: the window over which the cost is measured")
	idleWatch   = flag.Duration("idle-watch", 0, "idle set: after the window, how long to watch that every node stays Ready with no container restarted and no probe failed (0: not watched)")
	idleProfile = flag.String("idle-profile", "", "idle set: a folder for CPU profiles of the API server and each kubelet, taken in the window's middle (empty: none)")
)

// idleCases measure what an idle cluster costs (make idle-cost): init,
// rest until steady, then one window in which the host's QEMU time and
// the guests' own counters are read side by side.
var idleCases = []clusterCase{
	{"", (*suite).init},
	{"", (*suite).idleSteady},
	{"", (*suite).idleMeasure},
	{"", (*suite).idleWatchSteady},
}

// idleSteady waits until every node and every kube-system pod is Ready,
// then lets the cluster rest: what init started (image unpacking, the
// first reconciles) is not idle work.
func (s *suite) idleSteady() {
	var names []string
	for _, n := range s.c.Nodes() {
		names = append(names, n.Name)
	}
	s.waitFor("every node Ready", patience(20*time.Minute), s.ready(names...))
	s.p.doing("every kube-system pod Ready")
	if out, err := s.k("-n", "kube-system", "wait", "--for=condition=Ready", "pod", "--all", timeoutFlag(15*time.Minute)); err != nil {
		s.t.Fatalf("kube-system pods not Ready: %v\n%s", err, out)
	}
	s.p.done("every kube-system pod Ready")
	s.noFailedUnits()
	s.p.doing("rest " + idleSettle.String())
	time.Sleep(*idleSettle)
	s.p.done("rest " + idleSettle.String())
}

// noFailedUnits: a unit that failed on a node (a tuning the kernel no
// longer has, say) fails the run, since what it set is not in force.
func (s *suite) noFailedUnits() {
	for _, n := range s.c.Nodes() {
		out, err := s.orreryAsOwner("services", n.Name, "-o", "json")
		if err != nil {
			s.t.Fatalf("orrery services %s: %v\n%s", n.Name, err, lastLines(out, 5))
		}
		var units []struct{ Name, Active, Result string }
		// The output has the CLI's own notes (stderr) before the JSON.
		if i := strings.IndexByte(out, '['); i > 0 {
			out = out[i:]
		}
		if err := json.Unmarshal([]byte(out), &units); err != nil {
			s.t.Fatalf("orrery services %s -o json: %v", n.Name, err)
		}
		for _, u := range units {
			if u.Active == "failed" {
				s.t.Errorf("%s: unit %s failed (%s): orrery logs %s %s says why", n.Name, u.Name, u.Result, n.Name, u.Name)
			}
		}
	}
	if s.t.Failed() {
		s.t.FailNow()
	}
}

// idleReading is one node's part of the window.
type idleReading struct {
	node      string
	hostCores float64
	rates     *inspect.Rates
	journal   map[string]int
	err       error
}

// idleMeasure reads, over -idle-window, each node's QEMU CPU time on the
// host and its own counters ('orrery top'), then its journal of the
// window, and prints them.
func (s *suite) idleMeasure() {
	phase := "measure an idle window of " + idleWindow.String()
	s.p.doing(phase)
	start := time.Now()
	gcBefore, reqBefore := s.goRuntimes(), s.apiRequests()
	readings := make([]*idleReading, len(s.c.Nodes()))
	var wg sync.WaitGroup
	for i, n := range s.c.Nodes() {
		readings[i] = &idleReading{node: n.Name}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.readIdle(n, readings[i])
		}()
	}
	if *idleProfile != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(max(0, *idleWindow/2-profileSeconds*time.Second/2))
			s.cpuProfiles(*idleProfile)
		}()
	}
	wg.Wait()
	for _, r := range readings {
		if r.err != nil {
			s.t.Fatalf("%s: %v", r.node, r.err)
		}
		if r.journal, r.err = s.journalCounts(r.node, start); r.err != nil {
			s.t.Logf("%s's journal of the window: %v", r.node, r.err)
		}
	}
	gcAfter, reqAfter := s.goRuntimes(), s.apiRequests()
	s.p.done(phase)
	fmt.Print(idleReport(readings, s.podNames()))
	fmt.Print(gcReport(gcBefore, gcAfter, time.Since(start)))
	fmt.Print(requestReport(reqBefore, reqAfter, time.Since(start)))
}

// profileSeconds is how long a CPU profile samples: the API server ends
// any request to it (its profile handler too) after 60 s.
const profileSeconds = 50

// cpuProfiles writes a CPU profile of the API server and of each node's
// kubelet into dir, all taken at once, and prints where each went and
// how to read it. A profile costs little: Go samples 100 times a second.
func (s *suite) cpuProfiles(dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.t.Errorf("profiles: %v", err)
		return
	}
	q := "/debug/pprof/profile?seconds=" + strconv.Itoa(profileSeconds)
	paths := map[string]string{"kube-apiserver": q}
	for _, n := range s.c.Nodes() {
		paths["kubelet-"+n.Name] = "/api/v1/nodes/" + n.Name + "/proxy" + q
	}
	var wg sync.WaitGroup
	for name, p := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			file := filepath.Join(dir, name+".pprof")
			cmd := exec.CommandContext(s.ctx, "ip", "netns", "exec", namespace, s.kc, "--kubeconfig", s.kubeconfig(), "get", "--raw", p)
			out, err := cmd.Output()
			if err == nil {
				err = os.WriteFile(file, out, 0o644)
			}
			if err != nil {
				s.t.Logf("CPU profile of %s: %v", name, err)
				return
			}
			s.t.Logf("CPU profile of %s over %d s: %s (go tool pprof -top %s)", name, profileSeconds, file, file)
		}()
	}
	wg.Wait()
}

// apiRequests counts the requests the API server has answered so far
// (apiserver_request_total), by verb, resource and answer code.
func (s *suite) apiRequests() map[string]float64 {
	text, err := s.k("get", "--raw", "/metrics")
	if err != nil {
		return nil
	}
	counts := map[string]float64{}
	for line := range strings.Lines(text) {
		labels, ok := strings.CutPrefix(line, "apiserver_request_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(labels, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		l := map[string]string{}
		for kv := range strings.SplitSeq(labels, ",") {
			k, val, _ := strings.Cut(kv, "=")
			l[k] = strings.Trim(val, `"`)
		}
		what := l["resource"]
		if what == "" {
			what = "(not a resource)"
		}
		if l["group"] != "" {
			what += "." + l["group"]
		}
		if l["subresource"] != "" {
			what += "/" + l["subresource"]
		}
		counts[l["verb"]+" "+what+" "+l["code"]] += v
	}
	return counts
}

// requestReport prints the API server's busiest kinds of request over
// the window, a minute at a time.
func requestReport(before, after map[string]float64, window time.Duration) string {
	type row struct {
		what string
		rate float64
	}
	var rows []row
	for what, n := range after {
		if d := n - before[what]; d > 0 {
			rows = append(rows, row{what, d / window.Minutes()})
		}
	}
	slices.SortFunc(rows, func(a, b row) int { return cmp.Compare(b.rate, a.rate) })
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nAPI REQUEST (VERB RESOURCE CODE)\tA MINUTE")
	for _, r := range rows[:min(len(rows), 15)] {
		fmt.Fprintf(w, "%s\t%.1f\n", r.what, r.rate)
	}
	w.Flush()
	return b.String()
}

// goRuntime is what a Go program's metrics say of its garbage collector.
type goRuntime struct {
	cycles, heapBytes, goalBytes float64
}

// goRuntimes reads the garbage collectors of the Go programs whose
// metrics the API server serves: itself, and each node's kubelet.
func (s *suite) goRuntimes() map[string]goRuntime {
	paths := map[string]string{"kube-apiserver": "/metrics"}
	for _, n := range s.c.Nodes() {
		paths["kubelet on "+n.Name] = "/api/v1/nodes/" + n.Name + "/proxy/metrics"
	}
	out := map[string]goRuntime{}
	for name, p := range paths {
		text, err := s.k("get", "--raw", p)
		if err != nil {
			continue
		}
		var g goRuntime
		for line := range strings.Lines(text) {
			f := strings.Fields(line)
			if len(f) != 2 {
				continue
			}
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				continue
			}
			switch f[0] {
			case "go_gc_duration_seconds_count":
				g.cycles = v
			case "go_memstats_heap_alloc_bytes":
				g.heapBytes = v
			case "go_memstats_next_gc_bytes":
				g.goalBytes = v
			}
		}
		out[name] = g
	}
	return out
}

// gcReport prints how often each Go program collected over the window.
func gcReport(before, after map[string]goRuntime, window time.Duration) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nGO PROGRAM\tGC CYCLES/MIN\tHEAP MiB (END)\tNEXT GC AT MiB")
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range after {
			if !yield(n) {
				return
			}
		}
	})
	for _, n := range names {
		a, ok := before[n]
		if !ok {
			continue
		}
		z := after[n]
		fmt.Fprintf(w, "%s\t%.1f\t%.0f\t%.0f\n", n, (z.cycles-a.cycles)/window.Minutes(), z.heapBytes/(1<<20), z.goalBytes/(1<<20))
	}
	w.Flush()
	return b.String()
}

// readIdle runs 'orrery top' over the window and reads the node's QEMU
// CPU time from when top took its first snapshot to when it ended.
func (s *suite) readIdle(n *cloud.Node, r *idleReading) {
	args := []string{"netns", "exec", namespace, s.orr, "top", n.Name, "--workspace", s.out,
		"--master-secret", filepath.Join(s.out, workspace.MasterSecretFile), "--kubeconfig", s.kubeconfig(), "--mini-dir", s.dir}
	args = append(append(args, s.ownerChecks()...), "--interval", idleWindow.String(), "-o", "json", "--timeout", "5m")
	cmd := exec.CommandContext(s.ctx, "ip", args...)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		r.err = err
		return
	}
	if err := cmd.Start(); err != nil {
		r.err = fmt.Errorf("orrery top: %w", err)
		return
	}
	var began, ended float64
	var beganAt time.Time
	var errText strings.Builder
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		errText.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "reading them again") {
			began, beganAt = qemuSeconds(n.VM().PID()), time.Now()
		}
	}
	if err := cmd.Wait(); err != nil {
		r.err = fmt.Errorf("orrery top: %w\n%s", err, errText.String())
		return
	}
	ended = qemuSeconds(n.VM().PID())
	if beganAt.IsZero() || began < 0 || ended < 0 {
		r.err = fmt.Errorf("no QEMU CPU time for %s (pid %d); orrery top said:\n%s", n.Name, n.VM().PID(), errText.String())
		return
	}
	r.hostCores = (ended - began) / time.Since(beganAt).Seconds()
	r.rates = &inspect.Rates{}
	if err := json.Unmarshal(stdout.Bytes(), r.rates); err != nil {
		r.err = fmt.Errorf("orrery top's JSON: %w", err)
		return
	}
	// kubelet, containerd, their shims and the kernel's threads at least.
	if len(r.rates.Processes) < 20 {
		r.err = fmt.Errorf("the node's inspect service sees %d processes: it must see every process (ProtectProc in orrery-inspectd.service)", len(r.rates.Processes))
	}
}

// qemuSeconds is the CPU time (user and system, every thread) of the
// process pid, -1 if it cannot be read.
func qemuSeconds(pid int) float64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return -1
	}
	p, err := inspectserver.ParseProcStat(b)
	if err != nil {
		return -1
	}
	return float64(p.GetCpuMicros()) / 1e6
}

// journalCounts counts node's journal entries since start, by unit (by
// program for those of no unit, the kernel's among them).
func (s *suite) journalCounts(node string, start time.Time) (map[string]int, error) {
	out, err := s.orreryAsOwner("logs", node, "--since", start.UTC().Format(time.RFC3339), "-n", "20000", "-o", "json")
	if err != nil {
		return nil, fmt.Errorf("orrery logs: %w\n%s", err, lastLines(out, 5))
	}
	counts := map[string]int{}
	for line := range strings.Lines(out) {
		var e struct{ Unit, Identifier string }
		if json.Unmarshal([]byte(line), &e) != nil {
			continue
		}
		key := e.Unit
		if key == "" {
			key = "(" + e.Identifier + ")"
		}
		counts[key]++
	}
	return counts, nil
}

// podNames maps the cgroup name kubelet gives each pod to the pod's
// name.
func (s *suite) podNames() map[string]string {
	// A static pod's cgroup is named by its hash, not its mirror pod's UID.
	out, err := s.k("get", "pods", "-A", "-o", `jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name} {.metadata.uid} {.metadata.annotations.kubernetes\.io/config\.hash}{"\n"}{end}`)
	names := map[string]string{}
	if err != nil {
		return names
	}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		for _, id := range f[min(1, len(f)):] {
			names["pod"+strings.ReplaceAll(id, "-", "_")] = f[0]
		}
	}
	return names
}

// idleReport prints the window: a line per node, then each node's
// busiest processes and cgroups and its journal's writers.
func idleReport(rs []*idleReading, pods map[string]string) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nIDLE NODE\tHOST CORES (QEMU)\tGUEST vCPUs BUSY\tUSER\tSYSTEM\tIRQ+SOFTIRQ\tSWITCHES/S\tMEMORY USED MiB\tJOURNAL ENTRIES/MIN")
	total := 0.0
	for _, r := range rs {
		total += r.hostCores
		entries := 0
		for _, n := range r.journal {
			entries += n
		}
		x := r.rates
		fmt.Fprintf(w, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t%.0f\t%.1f\n", r.node, r.hostCores, x.Busy, x.User, x.System, x.IRQ+x.SoftIRQ,
			x.SwitchesPerSecond, float64(x.MemoryUsedBytes)/(1<<20), float64(entries)/x.Window.Minutes())
	}
	fmt.Fprintf(w, "all nodes\t%.2f\t\t\t\t\t\t\t\n", total)
	w.Flush()
	for _, r := range rs {
		x := r.rates
		fmt.Fprintf(&b, "\n%s over %s: processes (the busiest 20)\n", r.node, x.Window.Round(time.Second))
		w = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "PROCESS\tvCPUs\tSWITCHES/S\tRSS MiB\tCGROUP")
		for _, p := range x.Processes[:min(20, len(x.Processes))] {
			fmt.Fprintf(w, "%s\t%.3f\t%.0f\t%.0f\t%s\n", p.Name, p.CPU, p.SwitchesPerSecond, float64(p.RSSBytes)/(1<<20), cgroupName(p.Cgroup, pods))
		}
		fmt.Fprintf(w, "(kernel threads)\t%.3f\t\t\t\n", x.KernelThreads)
		w.Flush()
		fmt.Fprintf(&b, "\n%s: cgroups (services and pods)\n", r.node)
		w = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "CGROUP\tvCPUs\tWORKING SET MiB")
		for _, c := range x.Cgroups {
			if !inspect.ServiceOrPod(c.Path) {
				continue
			}
			if c.CPU >= 0.001 || c.WorkingSetBytes >= 32<<20 {
				fmt.Fprintf(w, "%s\t%.3f\t%.0f\n", cgroupName(c.Path, pods), c.CPU, float64(c.WorkingSetBytes)/(1<<20))
			}
		}
		// The kernel's own work is in no cgroup of these: its threads,
		// and the interrupts it handled for whoever ran.
		fmt.Fprintf(w, "(kernel threads)\t%.3f\t\n(interrupts, softirqs)\t%.3f\t\n", x.KernelThreads, x.IRQ+x.SoftIRQ)
		w.Flush()
		fmt.Fprintf(&b, "\n%s: journal entries a minute, by unit\n", r.node)
		units := slices.Collect(func(yield func(string) bool) {
			for u := range r.journal {
				if !yield(u) {
					return
				}
			}
		})
		slices.SortFunc(units, func(a, c string) int { return r.journal[c] - r.journal[a] })
		w = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		for _, u := range units[:min(12, len(units))] {
			fmt.Fprintf(w, "%s\t%.1f\n", u, float64(r.journal[u])/x.Window.Minutes())
		}
		w.Flush()
	}
	return b.String()
}

// cgroupName is a cgroup as the report shows it: a pod by its name, a
// service by its unit.
func cgroupName(path string, pods map[string]string) string {
	for _, part := range strings.Split(path, "/") {
		if i := strings.Index(part, "-pod"); i >= 0 && strings.HasSuffix(part, ".slice") {
			if name, ok := pods[strings.TrimSuffix(part[i+1:], ".slice")]; ok {
				return name
			}
		}
	}
	if path == "" {
		return "-"
	}
	return filepath.Base(path)
}

// idleWatchSteady watches the cluster for -idle-watch: every node must
// stay Ready, no container restart, no probe fail.
func (s *suite) idleWatchSteady() {
	if *idleWatch <= 0 {
		return
	}
	phase := "idle " + idleWatch.String() + ": every node Ready, no restart, no failed probe"
	s.p.doing(phase)
	start := time.Now()
	before := s.restartCounts()
	var notReady []string
	for end := start.Add(*idleWatch); time.Now().Before(end); time.Sleep(30 * time.Second) {
		out, err := s.k("get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}`)
		if err != nil {
			notReady = append(notReady, fmt.Sprintf("%s: the API server did not answer: %v", time.Since(start).Round(time.Second), err))
			continue
		}
		for _, f := range strings.Fields(out) {
			if !strings.HasSuffix(f, "=True") {
				notReady = append(notReady, fmt.Sprintf("%s: %s", time.Since(start).Round(time.Second), f))
			}
		}
	}
	var restarted []string
	for c, n := range s.restartCounts() {
		if n > before[c] {
			restarted = append(restarted, fmt.Sprintf("%s restarted %d times", c, n-before[c]))
		}
	}
	var probes []string
	for _, n := range s.c.Nodes() {
		out, err := s.orreryAsOwner("logs", n.Name, "kubelet", "--since", start.UTC().Format(time.RFC3339), "-n", "20000")
		if err != nil {
			probes = append(probes, fmt.Sprintf("%s: its kubelet's journal could not be read: %v", n.Name, err))
			continue
		}
		for line := range strings.Lines(out) {
			if strings.Contains(line, "Probe failed") {
				probes = append(probes, n.Name+": "+strings.TrimSpace(line))
			}
		}
	}
	slices.Sort(restarted)
	fmt.Printf("\nIDLE FOR %s: %d times a node was not Ready (or the API server did not answer), %d containers restarted, %d failed probes\n",
		idleWatch, len(notReady), len(restarted), len(probes))
	for _, l := range slices.Concat(notReady, restarted, probes) {
		fmt.Println("  " + l)
	}
	if len(notReady)+len(restarted)+len(probes) > 0 {
		s.t.Fatalf("the idle cluster was not steady for %s (above)", idleWatch)
	}
	s.p.done(phase)
}

// restartCounts is each container's restart count, by namespace/pod/container.
func (s *suite) restartCounts() map[string]int {
	out, err := s.k("get", "pods", "-A", "-o", `jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}={range .status.containerStatuses[*]}{.name}:{.restartCount},{end}{"\n"}{end}`)
	counts := map[string]int{}
	if err != nil {
		s.t.Logf("restart counts: %v", err)
		return counts
	}
	for line := range strings.Lines(out) {
		pod, containers, _ := strings.Cut(strings.TrimSpace(line), "=")
		for _, c := range strings.Split(containers, ",") {
			name, v, ok := strings.Cut(c, ":")
			if n, err := strconv.Atoi(v); ok && err == nil {
				counts[pod+"/"+name] = n
			}
		}
	}
	return counts
}
