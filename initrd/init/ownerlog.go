package main

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/orrery-dev/orrery/internal/inspectserver"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
	"github.com/orrery-dev/orrery/internal/redact"
)

// keptLines is how many of its log lines the initrd keeps for its owner:
// a boot writes tens, a node that waits long for its key a line every
// few retries.
const keptLines = 4000

// logLine is one line of the initrd's log.
type logLine struct {
	at   time.Time
	text string
}

// lineLog keeps the initrd's newest log lines, for the inspect service,
// redacted as they come: it sees them from the first, so a key printed a
// line at a time goes whole, and a window into the log cannot start
// inside one.
type lineLog struct {
	mu     sync.Mutex
	lines  []logLine
	redact redact.Lines
}

func (l *lineLog) add(at time.Time, text string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, logLine{at: at, text: l.redact.Line(text)})
	if len(l.lines) > keptLines {
		l.lines = append(l.lines[:0], l.lines[len(l.lines)-keptLines:]...)
	}
}

// after returns the lines since t, at most n of the newest.
func (l *lineLog) after(t time.Time, n int) []logLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logLine
	for _, ln := range l.lines {
		if ln.at.After(t) {
			out = append(out, ln)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return out
}

// errInitrdJournal refuses what the initrd has not: units, other boots,
// the kernel's log.
var errInitrdJournal = errors.New("the node is in its initrd, which serves its own log only: ask for it without a unit, boot or kernel flag (its console shows the kernel's messages)")

// pollEvery is how often a follower looks for new lines.
const pollEvery = 500 * time.Millisecond

// Read implements inspectserver.JournalReader over the initrd's log.
func (l *lineLog) Read(ctx context.Context, q inspectserver.Query, emit func([]*inspectpb.JournalEntry) error) error {
	if q.Kernel || q.Boot != 0 || q.Unit != "" {
		return errInitrdJournal
	}
	since := q.Since.Add(-time.Nanosecond)
	n := q.Lines
	for {
		lines := l.after(since, n)
		if len(lines) > 0 {
			es := make([]*inspectpb.JournalEntry, len(lines))
			for i, ln := range lines {
				es[i] = &inspectpb.JournalEntry{TimeUnixMicros: ln.at.UnixMicro(), Identifier: "orrery-init", Pid: 1, Priority: 6, Message: ln.text}
			}
			if err := emit(es); err != nil {
				return err
			}
			since = lines[len(lines)-1].at
		}
		if !q.Follow {
			return nil
		}
		n = keptLines
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pollEvery):
		}
	}
}
