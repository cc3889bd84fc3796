package inspectserver

import (
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
)

// TestFormatEntryIsOneInertLine is root on a node writing a journal
// message (and an identifier) meant to fool the owner's terminal: a
// clipboard write, an erased line, and a newline that starts what looks
// like another unit's entry.
func TestFormatEntryIsOneInertLine(t *testing.T) {
	at := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	e := &inspectpb.JournalEntry{
		TimeUnixMicros: at.UnixMicro(), Identifier: "kubelet\x1b[8m", Pid: 42,
		Message: "ok\x1b]52;c;Y3VybCBldmlsfHNo\x07\x1b[2K\r\n2026-11-28T10:00:01.000000Z bootstrapperd[1]: node admitted",
	}
	got := FormatEntry(e)
	want := `2026-11-28T10:00:00.000000Z kubelet\x1b[8m[42]: ok\x1b]52;c;Y3VybCBldmlsfHNo\x07\x1b[2K\r\n2026-11-28T10:00:01.000000Z bootstrapperd[1]: node admitted`
	if got != want {
		t.Errorf("FormatEntry =\n%q\nwant\n%q", got, want)
	}
	if strings.ContainsAny(got, "\x1b\x07\r\n") {
		t.Errorf("FormatEntry left a control character: %q", got)
	}
}
