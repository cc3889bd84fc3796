package nodeservice

import (
	"fmt"
	"time"

	"github.com/orrery-dev/orrery/internal/proto/nodepb"
)

// FormatEntry renders an entry as one line, the way journalctl's
// short-iso-precise output does, in UTC: time, writer[pid]: message.
func FormatEntry(e *nodepb.JournalEntry) string {
	t := time.UnixMicro(e.GetTimeUnixMicros()).UTC().Format("2006-01-02T15:04:05.000000Z")
	who := e.GetIdentifier()
	if who == "" {
		who = e.GetUnit()
	}
	if e.GetPid() != 0 {
		who = fmt.Sprintf("%s[%d]", who, e.GetPid())
	}
	return t + " " + who + ": " + e.GetMessage()
}
