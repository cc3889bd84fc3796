// Package failurelog gathers what a node sends its owner when an init
// fails: the journal of this boot and the ends of the control-plane
// containers' own logs, as one bounded text.
//
// The journal alone did not explain the failures that matter most. When
// the API server did not come up with one host core kept busy, 2,572 of the
// journal's last 3,000 lines were kubelet's "Unable to register mirror pod
// because node is not registered yet", and the API server's and etcd's own
// logs, which say why they are slow or why they exit, are not in the
// journal at all: kubelet writes them to files under /var/log/pods.
package failurelog

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Noise are journal lines that kubelet repeats many times a second while
// the API server is not there yet; they tell nothing the other lines do not.
var Noise = []string{
	"Unable to register mirror pod because node is not registered yet",
}

// ControlPlane are the static pods whose logs a failed init reports.
var ControlPlane = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// Limits bound the report, which travels in one gRPC message (gRPC's
// default limit is 4 MiB).
type Limits struct {
	// JournalLines is how many journal lines are kept, the newest, after
	// the noise is left out.
	JournalLines int
	// JournalBytes bounds the journal part.
	JournalBytes int
	// LogBytes bounds each container log file's part (its end is kept).
	LogBytes int
}

// DefaultLimits keep the report under 3.5 MiB: 2.5 MiB of journal and at
// most eight container logs (four pods, the current and the previous
// instance of each) of 128 KiB.
var DefaultLimits = Limits{JournalLines: 3000, JournalBytes: 2560 << 10, LogBytes: 128 << 10}

// Journal filters a journal (as journalctl prints it, oldest first):
// it leaves out the Noise lines and keeps the newest lines within lim. A
// header says how many lines were left out.
func Journal(raw []byte, lim Limits) []byte {
	var kept []string
	noisy := 0
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if isNoise(line) {
			noisy++
			continue
		}
		kept = append(kept, line)
	}
	older := 0
	if len(kept) > lim.JournalLines {
		older = len(kept) - lim.JournalLines
		kept = kept[older:]
	}
	body := strings.Join(kept, "\n")
	if len(body) > lim.JournalBytes {
		cut := len(body) - lim.JournalBytes
		if i := strings.IndexByte(body[cut:], '\n'); i >= 0 {
			cut += i + 1
		}
		older += strings.Count(body[:cut], "\n")
		body = body[cut:]
	}
	var out bytes.Buffer
	fmt.Fprintf(&out, "==> the journal of this boot (%d older lines and %d lines of kubelet's %q left out) <==\n", older, noisy, Noise[0])
	out.WriteString(body)
	if body != "" {
		out.WriteByte('\n')
	}
	return out.Bytes()
}

func isNoise(line string) bool {
	for _, n := range Noise {
		if strings.Contains(line, n) {
			return true
		}
	}
	return false
}

// ContainerLogs returns the end of each control-plane container's log
// that kubelet keeps under podLogDir (/var/log/pods): for every pod of
// kube-system named after one of ControlPlane, the current instance's log
// and the previous one's (kubelet keeps <restart count>.log for both), so
// a container that exited or was killed shows why. A missing directory
// yields nothing: before kubelet ran there are no logs.
func ContainerLogs(podLogDir string, lim Limits) []byte {
	var out bytes.Buffer
	for _, name := range ControlPlane {
		pods, _ := filepath.Glob(filepath.Join(podLogDir, "kube-system_"+name+"-*"))
		for _, pod := range pods {
			for _, file := range newestLogs(filepath.Join(pod, name), 2) {
				writeTail(&out, file, lim.LogBytes)
			}
		}
	}
	return out.Bytes()
}

// newestLogs returns up to n of dir's <number>.log files, oldest first.
func newestLogs(dir string, n int) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var restarts []int
	for _, e := range entries {
		num, ok := strings.CutSuffix(e.Name(), ".log")
		if r, err := strconv.Atoi(num); ok && err == nil && e.Type().IsRegular() {
			restarts = append(restarts, r)
		}
	}
	slices.Sort(restarts)
	if len(restarts) > n {
		restarts = restarts[len(restarts)-n:]
	}
	files := make([]string, len(restarts))
	for i, r := range restarts {
		files[i] = filepath.Join(dir, strconv.Itoa(r)+".log")
	}
	return files
}

// writeTail writes a header and the last limit bytes of file, from the
// first whole line.
func writeTail(out *bytes.Buffer, file string, limit int) {
	f, err := os.Open(file)
	if err != nil {
		fmt.Fprintf(out, "==> %s: %v <==\n", file, err)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		fmt.Fprintf(out, "==> %s: %v <==\n", file, err)
		return
	}
	start := max(0, st.Size()-int64(limit))
	buf := make([]byte, st.Size()-start)
	n, err := f.ReadAt(buf, start)
	buf = buf[:n]
	if start > 0 {
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			buf = buf[i+1:]
		}
	}
	what := "all of it"
	if start > 0 {
		what = fmt.Sprintf("its last %d bytes", len(buf))
	}
	fmt.Fprintf(out, "==> %s (%s) <==\n", file, what)
	if err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintf(out, "read: %v\n", err)
	}
	out.Write(buf)
	if len(buf) > 0 && buf[len(buf)-1] != '\n' {
		out.WriteByte('\n')
	}
}
