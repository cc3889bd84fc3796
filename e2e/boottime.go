//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// phase is one row of the suite's timing table.
type phase struct {
	name string
	took time.Duration
}

// bootMarkers are lines a node prints on its serial console at the steps
// of its boot, in order.
var bootMarkers = []struct{ name, text string }{
	{"kernel starts", "Linux version"},
	{"initrd /init starts", "orrery-init: start:"},
	{"switch to the OS", "orrery-init: switch-root:"},
	{"bootstrapperd listens", "waiting for init or join"},
	{"images imported", "baked images available"},
	{"kubeadm starts", "running kubeadm"},
}

// bootWatch records when each boot marker first appears on a node's
// console, measured from power-on: the boot timeline of the suite's
// table, firmware included (which the guest's own clock cannot see).
type bootWatch struct {
	node  string
	start time.Time
	mu    sync.Mutex
	seen  map[string]time.Duration
}

// watchBoot follows the serial log at path of a node powered on at start,
// until ctx ends.
func watchBoot(ctx context.Context, node, path string, start time.Time) *bootWatch {
	w := &bootWatch{node: node, start: start, seen: map[string]time.Duration{}}
	go w.follow(ctx, path)
	return w
}

func (w *bootWatch) follow(ctx context.Context, path string) {
	var off int64
	var carry []byte
	for next := 0; next < len(bootMarkers); {
		if f, err := os.Open(path); err == nil {
			f.Seek(off, io.SeekStart)
			chunk, _ := io.ReadAll(io.LimitReader(f, 16<<20))
			f.Close()
			off += int64(len(chunk))
			// Keep a line's start across reads; markers are short.
			buf := append(carry, chunk...)
			for next < len(bootMarkers) && bytes.Contains(buf, []byte(bootMarkers[next].text)) {
				w.mark(bootMarkers[next].name)
				next++
			}
			carry = buf[max(0, len(buf)-256):]
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (w *bootWatch) mark(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen[name] = time.Since(w.start)
}

// rows are the table rows of the timeline: each step's time since
// power-on and since the step before.
func (w *bootWatch) rows() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	var prev time.Duration
	for _, m := range bootMarkers {
		at, ok := w.seen[m.name]
		if !ok {
			continue
		}
		out = append(out, fmt.Sprintf("%s: %s\t%s (+%s)", w.node, m.name, at.Round(100*time.Millisecond), (at-prev).Round(100*time.Millisecond)))
		prev = at
	}
	return out
}

// initSteps reads the table of steps that 'orrery init' prints when done
// ("Time per step:", then one indented "name  duration" line each).
func initSteps(out string) []phase {
	var rows []phase
	_, table, ok := strings.Cut(out, "Time per step:\n")
	if !ok {
		return nil
	}
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "    ") {
			break
		}
		i := strings.LastIndex(strings.TrimRight(line, " "), "  ")
		if i < 0 {
			continue
		}
		d, err := time.ParseDuration(strings.TrimSpace(line[i:]))
		if err != nil {
			continue
		}
		rows = append(rows, phase{name: "  init: " + strings.TrimSpace(line[:i]), took: d})
	}
	return rows
}
