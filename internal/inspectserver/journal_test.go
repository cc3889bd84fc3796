package inspectserver

import (
	"bufio"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/inspectserver/journaltest"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
	"github.com/orrery-dev/orrery/internal/redact"
)

const (
	oldBoot = "08a514788617433d9cfb6f878019fd6b"
	newBoot = "3798e9c5525f4d6eb22a3dc5cebfef1f"
)

// testPrivateKey looks like what a failing tool might echo from a key file.
const testPrivateKey = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBzPfakeKEYmaterialNOTrealAAAAAAAAAAAAAAoAoGCCqGSM49\n-----END EC PRIVATE KEY-----"

// testJournal writes a node's journal of two boots and returns its directory.
func testJournal(t *testing.T) (string, time.Time) {
	t.Helper()
	dir := t.TempDir()
	start := time.Now().Add(-time.Hour).Truncate(time.Second)
	unit := func(u, id, pid string) map[string]string {
		return map[string]string{"_SYSTEMD_UNIT": u, "SYSLOG_IDENTIFIER": id, "_PID": pid, "PRIORITY": "6", "_TRANSPORT": "journal"}
	}
	var es []journaltest.Entry
	for i := range 5 {
		es = append(es, journaltest.Entry{Time: start.Add(time.Duration(i) * time.Second), BootID: oldBoot, Message: "old kubelet line " + string(rune('a'+i)), Fields: unit("kubelet.service", "kubelet", "41")})
	}
	t2 := start.Add(time.Minute)
	es = append(es,
		journaltest.Entry{Time: t2, BootID: newBoot, Message: "Linux version 6.1", Fields: map[string]string{"_TRANSPORT": "kernel", "SYSLOG_IDENTIFIER": "kernel", "PRIORITY": "5"}},
		journaltest.Entry{Time: t2.Add(1 * time.Second), BootID: newBoot, Message: "kubelet started", Fields: unit("kubelet.service", "kubelet", "42")},
		journaltest.Entry{Time: t2.Add(2 * time.Second), BootID: newBoot, Message: "kubeadm join 10.0.0.1:6443 --token abcdef.0123456789abcdef", Fields: unit("bootstrapperd.service", "bootstrapperd", "7")},
		journaltest.Entry{Time: t2.Add(3 * time.Second), BootID: newBoot, Message: "read key:\n" + testPrivateKey + "\ndone", Fields: unit("containerd.service", "containerd", "8")},
		journaltest.Entry{Time: t2.Add(4 * time.Second), BootID: newBoot, Message: strings.Repeat("x", 3*MaxMessageBytes), Fields: unit("containerd.service", "containerd", "8")},
		journaltest.Entry{Time: t2.Add(5 * time.Second), BootID: newBoot, Message: "kubelet stopped", Fields: unit("kubelet.service", "kubelet", "42")},
	)
	journaltest.Write(t, dir, es)
	return dir, t2
}

func read(t *testing.T, j Journalctl, req *inspectpb.JournalRequest) []*inspectpb.JournalEntry {
	t.Helper()
	q, err := QueryOf(req)
	if err != nil {
		t.Fatal(err)
	}
	var got []*inspectpb.JournalEntry
	if err := j.Read(context.Background(), q, func(es []*inspectpb.JournalEntry) error { got = append(got, es...); return nil }); err != nil {
		t.Fatal(err)
	}
	return got
}

func messages(es []*inspectpb.JournalEntry) []string {
	var m []string
	for _, e := range es {
		m = append(m, e.GetMessage())
	}
	return m
}

func TestJournalctlReadsAJournal(t *testing.T) {
	dir, t2 := testJournal(t)
	j := Journalctl{Dir: dir}

	got := read(t, j, &inspectpb.JournalRequest{Unit: "kubelet"})
	if m := messages(got); len(m) != 2 || m[0] != "kubelet started" || m[1] != "kubelet stopped" {
		t.Fatalf("kubelet's entries of this boot: %q", m)
	}
	if e := got[0]; e.GetUnit() != "kubelet.service" || e.GetIdentifier() != "kubelet" || e.GetPid() != 42 || e.GetPriority() != 6 || e.GetTimeUnixMicros() != t2.Add(time.Second).UnixMicro() {
		t.Fatalf("entry read as %v", e)
	}
	if m := messages(read(t, j, &inspectpb.JournalRequest{Unit: "kubelet.service", Boot: -1, Lines: 2})); len(m) != 2 || m[1] != "old kubelet line e" {
		t.Fatalf("last two of the boot before: %q", m)
	}
	if m := messages(read(t, j, &inspectpb.JournalRequest{Kernel: true})); len(m) != 1 || m[0] != "Linux version 6.1" {
		t.Fatalf("kernel log: %q", m)
	}
	if m := messages(read(t, j, &inspectpb.JournalRequest{SinceUnixSeconds: t2.Add(5 * time.Second).Unix()})); len(m) != 1 || m[0] != "kubelet stopped" {
		t.Fatalf("since the last second: %q", m)
	}

	all := read(t, j, &inspectpb.JournalRequest{})
	if len(all) != 6 {
		t.Fatalf("this boot has %d entries, want 6: %q", len(all), messages(all))
	}
	text := strings.Join(messages(all), "\n")
	for _, secret := range []string{"abcdef.0123456789abcdef", "fakeKEYmaterial", "BEGIN EC PRIVATE KEY"} {
		if strings.Contains(text, secret) {
			t.Errorf("the journal served %q", secret)
		}
	}
	if !strings.Contains(text, "--token "+redact.Redacted) || !strings.Contains(text, "read key:\n"+redact.Redacted+"\ndone") {
		t.Errorf("secrets not replaced where they were:\n%s", text)
	}
	if long := all[4].GetMessage(); len(long) > MaxMessageBytes+len("…") || !strings.HasSuffix(long, "…") {
		t.Errorf("a %d-byte message was served with %d bytes", 3*MaxMessageBytes, len(long))
	}
}

func TestJournalctlFailureIsReported(t *testing.T) {
	q, _ := QueryOf(&inspectpb.JournalRequest{})
	err := Journalctl{Dir: "/nonexistent"}.Read(context.Background(), q, func([]*inspectpb.JournalEntry) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "journalctl failed") {
		t.Fatalf("reading a missing journal: %v", err)
	}
}

func TestQueryOfRefusesBadRequests(t *testing.T) {
	for name, req := range map[string]*inspectpb.JournalRequest{
		"option as unit":    {Unit: "--file=/etc/shadow"},
		"path as unit":      {Unit: "../../etc/passwd"},
		"space in unit":     {Unit: "kubelet service"},
		"long unit":         {Unit: strings.Repeat("a", 300)},
		"future boot":       {Boot: 1},
		"follow a past one": {Boot: -1, Follow: true},
		"too many lines":    {Lines: MaxLines + 1},
		"kernel and unit":   {Kernel: true, Unit: "kubelet"},
	} {
		if _, err := QueryOf(req); err == nil {
			t.Errorf("%s: request %v accepted", name, req)
		}
	}
	q, err := QueryOf(&inspectpb.JournalRequest{Unit: "kubelet"})
	if err != nil || q.Unit != "kubelet.service" || q.Lines != DefaultLines {
		t.Fatalf("QueryOf(kubelet) = %+v, %v", q, err)
	}
}

func TestParseEntryFields(t *testing.T) {
	e, err := parseEntry([]byte(`{"__REALTIME_TIMESTAMP":"1700000000000000","MESSAGE":[104,105,255],"_PID":"9","PRIORITY":"9","UNIT":"x.service"}`), &redact.Writers{})
	if err != nil {
		t.Fatal(err)
	}
	if e.GetMessage() != "hi\uFFFD" || e.GetPid() != 9 || e.GetPriority() != 6 || e.GetUnit() != "x.service" {
		t.Fatalf("parsed %v", e)
	}
	for _, bad := range []string{``, `[]`, `{"MESSAGE":"no time"}`, `{"__REALTIME_TIMESTAMP":"soon"}`} {
		if _, err := parseEntry([]byte(bad), &redact.Writers{}); err == nil {
			t.Errorf("parseEntry(%q) accepted", bad)
		}
	}
}

func FuzzParseEntry(f *testing.F) {
	f.Add([]byte(`{"__REALTIME_TIMESTAMP":"1700000000000000","MESSAGE":"hello","_PID":"1","PRIORITY":"6","_SYSTEMD_UNIT":"a.service"}`))
	f.Add([]byte(`{"__REALTIME_TIMESTAMP":"1","MESSAGE":[[104],[105]]}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		e, err := parseEntry(line, &redact.Writers{})
		if err != nil {
			return
		}
		if len(e.GetMessage()) > MaxMessageBytes+len("…") || e.GetPriority() < 0 || e.GetPriority() > 7 {
			t.Fatalf("entry out of bounds: %v", e)
		}
	})
}

func TestReadLineDropsOverlongLines(t *testing.T) {
	in := "first\n" + strings.Repeat("y", 200<<10) + "\nlast"
	br := bufio.NewReaderSize(strings.NewReader(in), 16)
	var got []string
	for {
		l, err := readLine(br, 100<<10)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if l != nil {
			got = append(got, string(l))
		}
	}
	if len(got) != 2 || got[0] != "first" || got[1] != "last" {
		t.Fatalf("lines %q, want first and last", got)
	}
}

// A tool that prints a key file writes one journal entry a line, between
// other processes' entries: neither the whole journal nor a window that
// starts inside the key (-n, --since) shows the key's body.
func TestJournalHidesAKeyPrintedALineAtATime(t *testing.T) {
	dir := t.TempDir()
	start := time.Now().Add(-time.Hour).Truncate(time.Second)
	body := []string{
		"MHcCAQEEIBkV3mXq0Qh9aXl2rK0PvWc1s2M1y8i8a0R2e1Zq5m1xoAoGCCqGSM49",
		"AwEHoUQDQgAEq3Vh0Qx1n6m2TzYbXb2Q1n1q7w8eJmL0k9D1mYx6T1s3QfH2b5Rj",
		"Zk8lR2mQw==",
	}
	tool := map[string]string{"_SYSTEMD_UNIT": "debug.service", "SYSLOG_IDENTIFIER": "cat", "_PID": "77", "PRIORITY": "6", "_TRANSPORT": "stdout"}
	kubelet := map[string]string{"_SYSTEMD_UNIT": "kubelet.service", "SYSLOG_IDENTIFIER": "kubelet", "_PID": "42", "PRIORITY": "6", "_TRANSPORT": "stdout"}
	lines := append(append([]string{"-----BEGIN EC PRIVATE KEY-----"}, body...), "-----END EC PRIVATE KEY-----", "cat done")
	var es []journaltest.Entry
	at := func(i int) time.Time { return start.Add(time.Duration(i) * time.Second) }
	for i, l := range lines {
		es = append(es,
			journaltest.Entry{Time: at(2 * i), BootID: newBoot, Message: l, Fields: tool},
			journaltest.Entry{Time: at(2*i + 1), BootID: newBoot, Message: "I1201 sync loop " + string(rune('a'+i)), Fields: kubelet})
	}
	journaltest.Write(t, dir, es)
	j := Journalctl{Dir: dir}
	for name, req := range map[string]*inspectpb.JournalRequest{
		"whole journal":            {},
		"window of the last 7":     {Lines: 7},
		"window of the last 5":     {Lines: 5},
		"since the key's 2nd line": {SinceUnixSeconds: at(4).Unix()},
		"one unit, its last 3":     {Unit: "debug", Lines: 3},
	} {
		got := messages(read(t, j, req))
		text := strings.Join(got, "\n")
		for _, b := range body {
			if strings.Contains(text, b) {
				t.Errorf("%s: the key's line %q was served:\n%s", name, b, text)
			}
		}
		if !strings.Contains(text, "cat done") || req.Unit == "" && !strings.Contains(text, "I1201 sync loop f") {
			t.Errorf("%s: lines that hold no secret were not served:\n%s", name, text)
		}
	}
}
