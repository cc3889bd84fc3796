package cmd

import (
	"fmt"
	"io"
	"time"

	"github.com/orrery-dev/orrery/internal/owner"
	"github.com/orrery-dev/orrery/internal/owner/toolout"
)

// progressPrinter shows a flow's events as lines and keeps the timeline of
// its steps for the table at the end.
type progressPrinter struct {
	out   io.Writer
	start time.Time
	// verbose shows the output of the tools the node runs (kubeadm).
	verbose bool
	steps   toolout.Timeline
}

func (p *progressPrinter) event(e owner.Event) {
	switch e.Kind {
	case owner.Notice:
		fmt.Fprintln(p.out, e.Text)
	case owner.Step:
		p.steps.Begin(e.Text, e.Time)
		fmt.Fprintf(p.out, "  [%6.1fs] %s\n", e.Time.Sub(p.start).Seconds(), e.Text)
	case owner.Detail:
		fmt.Fprintf(p.out, "  %s\n", e.Text)
	case owner.ToolOutput:
		if p.verbose {
			_, _ = p.out.Write(e.Output) // the terminal; nowhere to say it failed
		}
	}
}
