package inspectserver

import (
	"fmt"
	"time"

	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
	"github.com/orrery-dev/orrery/internal/termtext"
)

// FormatEntry renders an entry as one line, the way journalctl's
// short-iso-precise output does, in UTC: time, writer[pid]: message. The
// writer and the message are the node's to choose: their control
// characters are escaped, so one entry is one line and drives no terminal.
func FormatEntry(e *inspectpb.JournalEntry) string {
	t := time.UnixMicro(e.GetTimeUnixMicros()).UTC().Format("2006-01-02T15:04:05.000000Z")
	who := termtext.Line(e.GetIdentifier())
	if who == "" {
		who = termtext.Line(e.GetUnit())
	}
	if e.GetPid() != 0 {
		who = fmt.Sprintf("%s[%d]", who, e.GetPid())
	}
	return t + " " + who + ": " + termtext.Line(e.GetMessage())
}
