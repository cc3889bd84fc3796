package inspectserver

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
)

// Bounds of a Usage answer: a node runs a few hundred processes and a few
// dozen cgroups; these leave room for a busy one and bound what a node
// full of pods costs to read and send.
const (
	MaxProcesses = 4096
	MaxCgroups   = 1024
	// maxCgroupDepth reaches a pod's containers:
	// kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod….slice/cri-containerd-….scope.
	maxCgroupDepth = 4
	// maxThreads bounds the per-thread files read for context switches.
	maxThreads = 20000
)

// userHZ is the unit of /proc's CPU times on every Linux architecture
// Orrery runs on (the kernel's USER_HZ, fixed at 100 for user space).
const userHZ = 100

// pfKthread is the kernel's PF_KTHREAD flag in /proc/PID/stat.
const pfKthread = 0x00200000

// Usage reads the node's counters from /proc and the cgroup v2 tree. Every
// file it reads is world-readable: the inspect service needs no privilege
// for it.
type Usage struct {
	// Root is prepended to every path read (tests); empty is "/".
	Root string
}

func (u Usage) path(p string) string { return filepath.Join(u.Root, p) }

// Read takes one snapshot. Only the node's own counters are required; a
// process that exits while it is read is left out, and a cgroup file that
// cannot be read leaves its field zero.
func (u Usage) Read() (*inspectpb.UsageResponse, error) {
	r := &inspectpb.UsageResponse{}
	up, err := os.ReadFile(u.path("/proc/uptime"))
	if err != nil {
		return nil, fmt.Errorf("read the node's uptime: %w", err)
	}
	f := strings.Fields(string(up))
	if len(f) == 0 {
		return nil, errors.New("read the node's uptime: /proc/uptime is empty")
	}
	secs, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return nil, fmt.Errorf("read the node's uptime: %w", err)
	}
	r.UptimeMicros = int64(secs * 1e6)
	if err := u.readStat(r); err != nil {
		return nil, err
	}
	if err := u.readMeminfo(r); err != nil {
		return nil, err
	}
	r.Cgroups = u.cgroups()
	r.Processes = u.processes()
	return r, nil
}

// readStat reads /proc/stat's cpu line, its per-CPU lines and ctxt.
func (u Usage) readStat(r *inspectpb.UsageResponse) error {
	b, err := os.ReadFile(u.path("/proc/stat"))
	if err != nil {
		return fmt.Errorf("read the node's CPU times: %w", err)
	}
	sawCPU := false
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
		case f[0] == "cpu":
			if len(f) < 9 {
				return fmt.Errorf("read the node's CPU times: /proc/stat's cpu line has %d fields, want at least 9", len(f))
			}
			t := make([]uint64, 8)
			for i := range t {
				if t[i], err = strconv.ParseUint(f[i+1], 10, 64); err != nil {
					return fmt.Errorf("read the node's CPU times: %w", err)
				}
				t[i] *= 1e6 / userHZ
			}
			r.UserMicros, r.SystemMicros, r.IdleMicros, r.IowaitMicros = t[0]+t[1], t[2], t[3], t[4]
			r.IrqMicros, r.SoftirqMicros, r.StealMicros = t[5], t[6], t[7]
			sawCPU = true
		case strings.HasPrefix(f[0], "cpu"):
			r.Cpus++
		case f[0] == "ctxt" && len(f) == 2:
			if r.ContextSwitches, err = strconv.ParseUint(f[1], 10, 64); err != nil {
				return fmt.Errorf("read the node's context switches: %w", err)
			}
		}
	}
	if !sawCPU {
		return errors.New("read the node's CPU times: /proc/stat has no cpu line")
	}
	return nil
}

func (u Usage) readMeminfo(r *inspectpb.UsageResponse) error {
	b, err := os.ReadFile(u.path("/proc/meminfo"))
	if err != nil {
		return fmt.Errorf("read the node's memory: %w", err)
	}
	kv := keyedKiB(b)
	r.MemoryTotalBytes, r.MemoryAvailableBytes = kv["MemTotal"], kv["MemAvailable"]
	return nil
}

// keyedKiB reads "Key: 123 kB" lines (meminfo) and "key 123" lines
// (status files without units are not read with it) into bytes.
func keyedKiB(b []byte) map[string]uint64 {
	kv := map[string]uint64{}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			n <<= 10
		}
		kv[k] = n
	}
	return kv
}

// cgroups walks the cgroup v2 tree below its root, breadth first, to
// maxCgroupDepth.
func (u Usage) cgroups() []*inspectpb.CgroupUsage {
	root := u.path("/sys/fs/cgroup")
	var out []*inspectpb.CgroupUsage
	level := []string{""}
	for depth := 1; depth <= maxCgroupDepth && len(level) > 0; depth++ {
		var next []string
		for _, parent := range level {
			entries, err := os.ReadDir(filepath.Join(root, parent))
			if err != nil {
				continue
			}
			for _, e := range entries {
				if !e.IsDir() {
					continue
				}
				if len(out) == MaxCgroups {
					return out
				}
				rel := filepath.Join(parent, e.Name())
				out = append(out, readCgroup(filepath.Join(root, rel), rel))
				next = append(next, rel)
			}
		}
		level = next
	}
	return out
}

func readCgroup(dir, rel string) *inspectpb.CgroupUsage {
	c := &inspectpb.CgroupUsage{Path: rel}
	if b, err := os.ReadFile(filepath.Join(dir, "cpu.stat")); err == nil {
		c.CpuMicros = spaceKeyed(b)["usage_usec"]
	}
	if b, err := os.ReadFile(filepath.Join(dir, "memory.current")); err == nil {
		c.MemoryBytes, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	c.WorkingSetBytes = c.MemoryBytes
	if b, err := os.ReadFile(filepath.Join(dir, "memory.stat")); err == nil {
		if inactive := spaceKeyed(b)["inactive_file"]; inactive < c.MemoryBytes {
			c.WorkingSetBytes = c.MemoryBytes - inactive
		}
	}
	return c
}

// spaceKeyed reads "key 123" lines (cpu.stat, memory.stat).
func spaceKeyed(b []byte) map[string]uint64 {
	kv := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			kv[k] = n
		}
	}
	return kv
}

// processes reads every process under /proc, up to MaxProcesses.
func (u Usage) processes() []*inspectpb.ProcessUsage {
	entries, err := os.ReadDir(u.path("/proc"))
	if err != nil {
		return nil
	}
	var out []*inspectpb.ProcessUsage
	threads := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		if len(out) == MaxProcesses {
			break
		}
		p, err := u.process(pid, &threads)
		if err != nil {
			continue // it exited, or is not a process we can read
		}
		out = append(out, p)
	}
	return out
}

func (u Usage) process(pid int, threads *int) (*inspectpb.ProcessUsage, error) {
	dir := u.path(filepath.Join("/proc", strconv.Itoa(pid)))
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return nil, err
	}
	p, err := ParseProcStat(b)
	if err != nil {
		return nil, err
	}
	if cg, err := os.ReadFile(filepath.Join(dir, "cgroup")); err == nil {
		p.Cgroup = unifiedCgroup(cg)
	}
	// A process's own status counts only its first thread's switches:
	// every thread's are summed, since a Go program switches on all of
	// them.
	tasks, err := os.ReadDir(filepath.Join(dir, "task"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return p, nil
	}
	for _, t := range tasks {
		if *threads >= maxThreads {
			break
		}
		*threads++
		st, err := os.ReadFile(filepath.Join(dir, "task", t.Name(), "status"))
		if err != nil {
			continue
		}
		kv := keyedKiB(st)
		p.VoluntarySwitches += kv["voluntary_ctxt_switches"]
		p.InvoluntarySwitches += kv["nonvoluntary_ctxt_switches"]
	}
	return p, nil
}

// unifiedCgroup is the cgroup v2 path in /proc/PID/cgroup ("0::/x"),
// relative to the root; empty if there is none.
func unifiedCgroup(b []byte) string {
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "0::"); ok {
			return strings.TrimPrefix(rest, "/")
		}
	}
	return ""
}

// ParseProcStat reads /proc/PID/stat: its command name sits in
// parentheses and may hold spaces and parentheses itself, so the fields
// after it are counted from the last ')'.
func ParseProcStat(b []byte) (*inspectpb.ProcessUsage, error) {
	s := string(b)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 1 || closing < open {
		return nil, errors.New("proc stat: no command name in parentheses")
	}
	pid, err := strconv.ParseInt(strings.TrimSpace(s[:open]), 10, 32)
	if err != nil || pid <= 0 {
		return nil, fmt.Errorf("proc stat: pid %q", strings.TrimSpace(s[:open]))
	}
	// Fields from the state on: field 3 of proc(5) is f[0].
	f := strings.Fields(s[closing+1:])
	const (
		flags   = 9 - 3
		utime   = 14 - 3
		stime   = 15 - 3
		threads = 20 - 3
		rss     = 24 - 3
	)
	if len(f) <= rss {
		return nil, fmt.Errorf("proc stat: %d fields after the command name, want at least %d", len(f), rss+1)
	}
	num := func(i int) (uint64, error) {
		n, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("proc stat: field %d: %w", i+3, err)
		}
		return n, nil
	}
	var v [5]uint64
	for i, idx := range []int{flags, utime, stime, threads} {
		if v[i], err = num(idx); err != nil {
			return nil, err
		}
	}
	// RSS is signed in the kernel's format; a negative one reads as 0.
	if n, err := strconv.ParseInt(f[rss], 10, 64); err == nil && n > 0 {
		v[4] = uint64(n)
	} else if err != nil {
		return nil, fmt.Errorf("proc stat: field %d: %w", rss+3, err)
	}
	name := s[open+1 : closing]
	if len(name) > 64 {
		name = name[:64]
	}
	return &inspectpb.ProcessUsage{
		Pid:          int32(pid),
		Name:         name,
		CpuMicros:    (v[1] + v[2]) * (1e6 / userHZ),
		Threads:      uint32(min(v[3], 1<<31)),
		RssBytes:     v[4] * uint64(os.Getpagesize()),
		KernelThread: v[0]&pfKthread != 0,
	}, nil
}
