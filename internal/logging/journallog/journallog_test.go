package journallog

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
)

type entry struct {
	msg    string
	pri    journal.Priority
	fields map[string]string
}

func capture(t *testing.T, fail error) (*slog.Logger, *[]entry, *bytes.Buffer) {
	t.Helper()
	var got []entry
	var fallback bytes.Buffer
	h := NewHandler("bootstrapperd", func(m string, p journal.Priority, f map[string]string) error {
		if fail != nil {
			return fail
		}
		got = append(got, entry{m, p, f})
		return nil
	}, &fallback)
	return slog.New(h), &got, &fallback
}

func TestEntriesCarryFields(t *testing.T) {
	log, got, _ := capture(t, nil)
	log = log.With("component", "initserver")
	log.Info("running kubeadm init", "phase", "kubeadm-init", "clusterID", "ab12", "elapsed", 1500*time.Millisecond)
	log.Debug("not sent")
	log.WithGroup("peer").Warn("refused a node", "addr", "10.42.2.101:4711", "error", `PCR 11 mismatch: "x"`)

	if len(*got) != 2 {
		t.Fatalf("%d entries, want 2 (debug is dropped)", len(*got))
	}
	e := (*got)[0]
	if e.msg != "running kubeadm init component=initserver phase=kubeadm-init clusterID=ab12 elapsed=1.5s" {
		t.Errorf("MESSAGE = %q", e.msg)
	}
	want := map[string]string{"SYSLOG_IDENTIFIER": "bootstrapperd", "COMPONENT": "initserver", "PHASE": "kubeadm-init", "CLUSTER_ID": "ab12", "ELAPSED": "1.5s"}
	for k, v := range want {
		if e.fields[k] != v {
			t.Errorf("field %s = %q, want %q", k, e.fields[k], v)
		}
	}
	if e.pri != journal.PriInfo {
		t.Errorf("priority %v", e.pri)
	}
	w := (*got)[1]
	if w.pri != journal.PriWarning || w.fields["PEER_ADDR"] != "10.42.2.101:4711" || w.fields["PEER_ERROR"] != `PCR 11 mismatch: "x"` {
		t.Errorf("warning entry %+v", w)
	}
	if !strings.Contains(w.msg, `peer.error="PCR 11 mismatch: \"x\""`) {
		t.Errorf("values with spaces or quotes are not quoted in MESSAGE: %q", w.msg)
	}
}

func TestFailedSendFallsBack(t *testing.T) {
	log, _, fallback := capture(t, errors.New("journald gone"))
	log.Error("join failed", "phase", "join")
	if !strings.Contains(fallback.String(), "join failed phase=join") || !strings.Contains(fallback.String(), "journald gone") {
		t.Fatalf("fallback got %q", fallback.String())
	}
}

func TestFieldName(t *testing.T) {
	for key, want := range map[string]string{
		"phase": "PHASE", "clusterID": "CLUSTER_ID", "retryIn": "RETRY_IN", "peer.addr": "PEER_ADDR",
		"startup": "STARTUP", "k8sVersion": "K8S_VERSION", "a-b": "A_B",
		"_SYSTEMD_UNIT": "", "9lives": "", "": "", "message": "ATTR_MESSAGE", "priority": "ATTR_PRIORITY",
		strings.Repeat("x", 65): "", "héllo": "H_LLO",
	} {
		if got := FieldName(key); got != want {
			t.Errorf("FieldName(%q) = %q, want %q", key, got, want)
		}
	}
}

// Entries go to the console too, one whole line each, in journald's
// console form, with attribute values that could break the line quoted.
func TestConsoleCopy(t *testing.T) {
	var console bytes.Buffer
	var sent int
	h := NewHandler("bootstrapperd", func(string, journal.Priority, map[string]string) error { sent++; return nil }, &bytes.Buffer{})
	h.console = &consoleWriter{w: &console, prefix: "bootstrapperd[42]: ", now: func() time.Duration { return 18*time.Second + 770358*time.Microsecond }}
	log := slog.New(h).With("component", "bootstrapperd")
	log.Info("waiting for init or join", "phase", "wait")
	log.Warn("refused a join service", "reason", "PCR 4 mismatch\n\x1b[2Jforged line")
	want := "[   18.770358] bootstrapperd[42]: waiting for init or join component=bootstrapperd phase=wait\n" +
		`[   18.770358] bootstrapperd[42]: refused a join service component=bootstrapperd reason="PCR 4 mismatch\n\x1b[2Jforged line"` + "\n"
	if console.String() != want {
		t.Fatalf("console:\n%q\nwant\n%q", console.String(), want)
	}
	if sent != 2 {
		t.Fatalf("%d entries reached the journal, want 2", sent)
	}
}
