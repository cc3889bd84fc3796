package upgradeserver

import (
	"bytes"
	"context"
	"sync"

	"github.com/orrery-dev/orrery/internal/proto/kubeupgradepb"
	"github.com/orrery-dev/orrery/internal/redact"
)

// maxLines bounds what a job keeps of its output for those who follow
// it: a kubeadm upgrade prints about a hundred lines. maxLineBytes splits
// a longer line once it is redacted, and maxBatch bounds the lines of one
// message, so that none nears gRPC's 4 MiB limit. maxPendingBytes bounds
// a line that has not ended: the rest of a longer one is dropped.
const (
	maxLines        = 5000
	maxLineBytes    = 4 << 10
	maxBatch        = 256
	maxPendingBytes = 64 << 10
)

// lineCut ends a line whose rest was dropped.
const lineCut = " [the rest of this line, past 64 KiB, is not shown]"

// job is one upgrade of the node, which runs to its end whoever follows
// it: kubeadm stopped halfway leaves a control plane worse off than
// either version.
type job struct {
	version string
	step    kubeupgradepb.Step

	mu      sync.Mutex
	lines   []string
	partial []byte
	changed chan struct{} // closed when lines or done change
	done    bool
	err     error
	onLine  func(string)
	redact  redact.Lines
	// dropLine: the line being written was cut, and its rest is dropped
	// up to its newline.
	dropLine bool
}

func newJob(version string, step kubeupgradepb.Step, onLine func(string)) *job {
	return &job{version: version, step: step, changed: make(chan struct{}), onLine: onLine}
}

// Write takes the job's output: whole lines, with what looks like a
// secret redacted, go to the followers. A line is redacted whole before
// it is split, so that no secret straddles a split and passes.
func (j *job) Write(p []byte) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := len(p)
	if j.dropLine {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			return n, nil
		}
		j.dropLine, p = false, p[i+1:]
	}
	j.partial = append(j.partial, p...)
	for {
		if i := bytes.IndexByte(j.partial, '\n'); i >= 0 {
			j.addLocked(string(j.partial[:i]))
			j.partial = j.partial[i+1:]
			continue
		}
		if len(j.partial) > maxPendingBytes {
			j.cutLocked()
			continue
		}
		return n, nil
	}
}

// cutLocked ends the pending line at maxPendingBytes, and drops the rest
// of it. The run of non-blank bytes at the cut goes too: it may be the
// start of a secret whose end, dropped, is what would have matched.
func (j *job) cutLocked() {
	head := j.partial[:maxPendingBytes]
	if k := bytes.LastIndexAny(head, " \t"); k >= 0 {
		head = head[:k]
	} else {
		head = nil
	}
	rest := j.partial[maxPendingBytes:]
	j.addLocked(string(head) + lineCut)
	if i := bytes.IndexByte(rest, '\n'); i >= 0 {
		j.partial = rest[i+1:]
		return
	}
	j.partial, j.dropLine = nil, true
}

func (j *job) addLocked(line string) {
	line = j.redact.Line(line)
	j.onLine(line)
	for {
		piece := line
		if len(piece) > maxLineBytes {
			piece = line[:maxLineBytes]
		}
		j.keepLocked(piece)
		line = line[len(piece):]
		if line == "" {
			break
		}
	}
	j.notifyLocked()
}

func (j *job) keepLocked(line string) {
	switch {
	case len(j.lines) < maxLines:
		j.lines = append(j.lines, line)
	case len(j.lines) == maxLines:
		j.lines = append(j.lines, "(more output than a follower is sent: the node's journal has it all)")
	}
}

func (j *job) notifyLocked() {
	close(j.changed)
	j.changed = make(chan struct{})
}

// finish ends the job with err.
func (j *job) finish(err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.partial) > 0 {
		j.addLocked(string(j.partial))
		j.partial = nil
	}
	j.done, j.err = true, err
	j.notifyLocked()
}

// follow sends the job's output from its first line until it ends, and
// returns how it ended; or ctx's error if the follower goes first.
func (j *job) follow(ctx context.Context, send func([]string) error) error {
	next := 0
	for {
		j.mu.Lock()
		batch := j.lines[next:min(next+maxBatch, len(j.lines))]
		more := next+len(batch) < len(j.lines)
		done, err, changed := j.done, j.err, j.changed
		j.mu.Unlock()
		if len(batch) > 0 {
			if serr := send(batch); serr != nil {
				return serr
			}
			next += len(batch)
		}
		if more {
			continue
		}
		if done {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// running reports whether the job has not ended.
func (j *job) running() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return !j.done
}
