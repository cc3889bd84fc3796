// Package owner runs the flows of a cluster's owner against its nodes:
// checking a node's attestation (Verify) and initialising a cluster on the
// first control plane (Init). Each flow takes its inputs as values, reports
// progress through a callback and returns its result; it parses no flags
// and prints nothing, so the CLI only turns flags into a config and events
// into lines, and tests drive the flows against a node of their own.
package owner

import (
	"sync"
	"time"
)

// EventKind says how an Event relates to the flow's steps.
type EventKind int

const (
	// Notice is a line for the owner that stands on its own.
	Notice EventKind = iota
	// Step starts a new step of the flow; Text names it. A step lasts
	// until the next one starts.
	Step
	// Detail says something about the current step.
	Detail
	// ToolOutput carries a chunk of a tool's output on the node
	// (kubeadm's), in Output.
	ToolOutput
)

// Event is something a flow reports while it runs.
type Event struct {
	Kind   EventKind
	Time   time.Time
	Text   string
	Output []byte
}

// Progress receives a flow's events, one at a time and in order.
type Progress func(Event)

// reporter hands events to a Progress from any goroutine of a flow.
type reporter struct {
	mu sync.Mutex
	p  Progress
}

func newReporter(p Progress) *reporter { return &reporter{p: p} }

func (r *reporter) emit(kind EventKind, text string, output []byte) {
	if r.p == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.p(Event{Kind: kind, Time: time.Now(), Text: text, Output: output})
}

func (r *reporter) notice(text string) { r.emit(Notice, text, nil) }
func (r *reporter) step(text string)   { r.emit(Step, text, nil) }
func (r *reporter) detail(text string) { r.emit(Detail, text, nil) }
