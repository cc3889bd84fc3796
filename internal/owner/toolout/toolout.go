// Package toolout follows the output of a tool that runs on a node (kubeadm)
// as it streams to the owner: it keeps the last part of it, to show and
// save when the tool fails, and it times the phases the tool announces,
// so that 'orrery init' can say where the minutes went.
package toolout

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// DefaultKeep is how much output a Follower keeps: the end of a failed
// kubeadm run, with its error and the phase it was in.
const DefaultKeep = 256 << 10

// Follower receives a tool's output in chunks of any size.
type Follower struct {
	// Keep is how many bytes of the output's end are kept; zero means
	// DefaultKeep.
	Keep int
	// OnPhase, if set, is called when the output enters a new phase.
	OnPhase func(name string)

	tail    []byte
	partial []byte
	phase   string
}

// Write implements io.Writer.
func (f *Follower) Write(p []byte) (int, error) {
	keep := f.Keep
	if keep == 0 {
		keep = DefaultKeep
	}
	f.tail = append(f.tail, p...)
	if len(f.tail) > keep {
		f.tail = append(f.tail[:0], f.tail[len(f.tail)-keep:]...)
	}
	f.partial = append(f.partial, p...)
	for {
		i := bytes.IndexByte(f.partial, '\n')
		if i < 0 {
			break
		}
		f.line(string(f.partial[:i]))
		f.partial = f.partial[i+1:]
	}
	// A line without an end within keep bytes is not a phase line.
	if len(f.partial) > keep {
		f.partial = f.partial[:0]
	}
	return len(p), nil
}

func (f *Follower) line(l string) {
	name, ok := KubeadmPhase(l)
	if !ok || name == f.phase {
		return
	}
	f.phase = name
	if f.OnPhase != nil {
		f.OnPhase(name)
	}
}

// Tail is the end of the output, at most its last n lines.
func (f *Follower) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(string(f.tail), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Output is all the output kept (see Keep).
func (f *Follower) Output() []byte { return f.tail }

// KubeadmPhase returns the phase a line of kubeadm's output belongs to:
// kubeadm starts each line of a phase with its name in brackets
// ("[certs] Generating ..."). Lines of other forms belong to none.
func KubeadmPhase(line string) (string, bool) {
	if !strings.HasPrefix(line, "[") {
		return "", false
	}
	end := strings.IndexByte(line, ']')
	if end < 2 || end > 40 {
		return "", false
	}
	name := line[1:end]
	// kubeadm reports applying patches inside the phase that writes a
	// manifest; it is not a phase of its own.
	if name == "patches" {
		return "", false
	}
	for _, r := range name {
		if (r < 'a' || r > 'z') && r != '-' {
			return "", false
		}
	}
	return name, true
}

// Step is one step of a timeline.
type Step struct {
	Name  string
	Start time.Time
	Took  time.Duration
}

// Timeline is a sequence of steps, each lasting until the next begins.
type Timeline struct {
	names  []string
	starts []time.Time
}

// Begin starts step name at t, ending the current one.
func (tl *Timeline) Begin(name string, t time.Time) {
	tl.names = append(tl.names, name)
	tl.starts = append(tl.starts, t)
}

// Steps returns the steps, the last one ending at end.
func (tl *Timeline) Steps(end time.Time) []Step {
	steps := make([]Step, len(tl.names))
	for i, name := range tl.names {
		until := end
		if i+1 < len(tl.starts) {
			until = tl.starts[i+1]
		}
		steps[i] = Step{Name: name, Start: tl.starts[i], Took: until.Sub(tl.starts[i])}
	}
	return steps
}

// WriteSteps writes steps as an indented table of names and durations.
func WriteSteps(w io.Writer, steps []Step) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, s := range steps {
		fmt.Fprintf(tw, "    %s\t%s\n", s.Name, s.Took.Round(100*time.Millisecond))
	}
	tw.Flush()
}
