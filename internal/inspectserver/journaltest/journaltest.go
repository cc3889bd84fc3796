// Package journaltest writes real journal files, as journald would, for
// tests that read them with journalctl: systemd-journal-remote turns
// entries in the journal export format into a journal file.
package journaltest

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Remote is where Debian's systemd-journal-remote package installs it.
const Remote = "/lib/systemd/systemd-journal-remote"

// Entry is one journal entry; Fields are its other fields (_SYSTEMD_UNIT,
// SYSLOG_IDENTIFIER, _PID, PRIORITY, _TRANSPORT, ...).
type Entry struct {
	Time    time.Time
	BootID  string
	Message string
	Fields  map[string]string
}

// Write writes entries into a new journal file in dir, which journalctl
// reads with --directory=dir.
func Write(tb testing.TB, dir string, entries []Entry) {
	tb.Helper()
	if _, err := os.Stat(Remote); err != nil {
		tb.Fatalf("%s is missing: install it with 'make deps' (Debian package systemd-journal-remote)", Remote)
	}
	var export bytes.Buffer
	for i, e := range entries {
		field(&export, "__REALTIME_TIMESTAMP", strconv.FormatInt(e.Time.UnixMicro(), 10))
		field(&export, "__MONOTONIC_TIMESTAMP", strconv.Itoa(i+1))
		field(&export, "_BOOT_ID", e.BootID)
		field(&export, "MESSAGE", e.Message)
		keys := make([]string, 0, len(e.Fields))
		for k := range e.Fields {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			field(&export, k, e.Fields[k])
		}
		export.WriteByte('\n')
	}
	in := filepath.Join(tb.TempDir(), "export")
	if err := os.WriteFile(in, export.Bytes(), 0o600); err != nil {
		tb.Fatal(err)
	}
	out := filepath.Join(dir, "test-"+strconv.FormatInt(time.Now().UnixNano(), 36)+".journal")
	if b, err := exec.Command(Remote, "--output="+out, in).CombinedOutput(); err != nil {
		tb.Fatalf("systemd-journal-remote: %v: %s", err, b)
	}
}

// field writes a field of the export format: KEY=value, or, for a value
// with a newline, KEY, its length as 64-bit little endian, and its bytes.
func field(w *bytes.Buffer, k, v string) {
	if !strings.Contains(v, "\n") {
		w.WriteString(k + "=" + v + "\n")
		return
	}
	w.WriteString(k + "\n")
	binary.Write(w, binary.LittleEndian, uint64(len(v)))
	w.WriteString(v + "\n")
}
