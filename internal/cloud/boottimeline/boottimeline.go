// Package boottimeline follows a node's serial console and records when
// each step of its boot first shows there, measured from power-on: the
// boot timeline that the boot test and the end-to-end suite print. It
// sees the firmware's share too, which the guest's own clock cannot.
package boottimeline

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"
)

// Step is a boot step and the text its console line holds.
type Step struct{ Name, Text string }

// Steps are the lines a node prints at the steps of its boot, in the
// order they usually come.
var Steps = []Step{
	{"kernel starts", "Linux version"},
	{"initrd /init starts", "orrery-init: start:"},
	{"switch to the OS", "orrery-init: switch-root:"},
	{"systemd starts", "running in system mode"},
	{"bootstrapperd listens", "waiting for init or join"},
	{"images imported", "baked images available"},
	{"kubeadm starts", "running kubeadm"},
}

// maxText bounds a step's text: a read keeps that many bytes of the one
// before, so that a line split across two reads is still found.
const maxText = 256

// Watch records the steps of one boot.
type Watch struct {
	node    string
	powerOn time.Time
	steps   []Step
	now     func() time.Time

	mu   sync.Mutex
	seen map[string]time.Duration
	done chan struct{}
}

// pollInterval is how often Follow reads the log: the timeline's
// resolution, a fraction of a second against steps seconds apart.
const pollInterval = 250 * time.Millisecond

// Follow reads the serial log at path of node, powered on at powerOn,
// until every one of Steps was seen or ctx ends.
func Follow(ctx context.Context, node, path string, powerOn time.Time) *Watch {
	return follow(ctx, node, path, powerOn, Steps, pollInterval)
}

func follow(ctx context.Context, node, path string, powerOn time.Time, steps []Step, interval time.Duration) *Watch {
	w := &Watch{node: node, powerOn: powerOn, steps: steps, now: time.Now,
		seen: map[string]time.Duration{}, done: make(chan struct{})}
	go w.read(ctx, path, interval)
	return w
}

func (w *Watch) read(ctx context.Context, path string, interval time.Duration) {
	defer close(w.done)
	var off int64
	var carry []byte
	for !w.all() {
		chunk := readFrom(path, off)
		off += int64(len(chunk))
		buf := append(carry, chunk...)
		w.find(buf)
		carry = slices.Clone(buf[max(0, len(buf)-maxText):])
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// readFrom returns what the file at path holds from off on, at most
// 16 MiB; nothing if it cannot be read (yet).
func readFrom(path string, off int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(f, 16<<20))
	return b
}

// find marks every step not seen yet whose text buf holds. Steps are
// matched each on its own: one that never shows (a kubeadm that never
// runs) or that comes out of order does not hide the others.
func (w *Watch) find(buf []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.steps {
		if _, ok := w.seen[s.Name]; !ok && bytes.Contains(buf, []byte(s.Text)) {
			w.seen[s.Name] = w.now().Sub(w.powerOn)
		}
	}
}

func (w *Watch) all() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.seen) == len(w.steps)
}

// Done is closed once the watch has stopped reading.
func (w *Watch) Done() <-chan struct{} { return w.done }

// At returns when the step named name was first seen, since power-on.
func (w *Watch) At(name string) (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	d, ok := w.seen[name]
	return d, ok
}

// Rows are the timeline as table rows, in the order the steps were seen:
// "node: step<TAB>time since power-on (+time since the step before)".
func (w *Watch) Rows() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	type row struct {
		name string
		at   time.Duration
	}
	var rows []row
	for _, s := range w.steps {
		if at, ok := w.seen[s.Name]; ok {
			rows = append(rows, row{s.Name, at})
		}
	}
	slices.SortStableFunc(rows, func(a, b row) int { return cmp.Compare(a.at, b.at) })
	var out []string
	var prev time.Duration
	for _, r := range rows {
		out = append(out, fmt.Sprintf("%s: %s\t%s (+%s)", w.node, r.name, r.at.Round(100*time.Millisecond), (r.at-prev).Round(100*time.Millisecond)))
		prev = r.at
	}
	return out
}
