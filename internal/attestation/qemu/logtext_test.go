package qemu_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"unicode"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
)

// A node with root writes its own measurement log. What it says about a
// PCR reaches the owner's terminal (in the error) and the journal (for a
// warn-only PCR), so it must arrive printable, on the lines the validator
// chose, and bounded.
func TestHostileLogDescriptionsAreDefused(t *testing.T) {
	n := newNode(t)
	hostile := []string{
		"initrd: \x1b[2J\x1b[1;1H\x1b]0;owned\x07leave-initrd",
		"initrd: x\nPCR 4 was measured from: firmware: all good\r\nnothing to see",
		"\u202eevil\u202c",
	}
	// Many long descriptions: every one within the log's own limits, but
	// together far too much for one error.
	for range 60 {
		hostile = append(hostile, strings.Repeat("A", 1000))
	}
	withTPM(t, n.tpm, func(rw io.ReadWriter) {
		for _, d := range hostile {
			if err := n.log.Measure(rw, 11, []byte("x"), d); err != nil {
				t.Fatal(err)
			}
			if err := n.log.Measure(rw, 12, []byte("x"), d); err != nil {
				t.Fatal(err)
			}
		}
	})
	m := expected()
	m[12] = measurements.Measurement{Expected: bytes.Repeat([]byte{0xbb}, 32), WarnOnly: true}
	var logs bytes.Buffer
	_, err := validator(t, n, m, &logs).Validate(context.Background(), issue(t, n), nonce)
	if err == nil {
		t.Fatal("attestation with a changed PCR 11 was accepted")
	}
	msg := err.Error()
	lines := strings.Split(msg, "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[1], "PCR 11 was measured from: ") {
		t.Errorf("error has %d lines, want the mismatch and one line about PCR 11:\n%s", len(lines), msg)
	}
	for _, r := range msg {
		if r != '\n' && !unicode.IsPrint(r) {
			t.Errorf("error keeps the non-printable rune %U", r)
		}
	}
	if len(msg) > 2048 {
		t.Errorf("error is %d bytes long; a node must not be able to flood the owner's terminal", len(msg))
	}
	if !strings.Contains(msg, "initrd: enter-initrd") {
		t.Errorf("error no longer names the honest component:\n%.300s", msg)
	}

	// The warn-only path logs the same text; check it without the error.
	m[11] = expected()[11]
	logs.Reset()
	n2 := newNode(t)
	withTPM(t, n2.tpm, func(rw io.ReadWriter) {
		for _, d := range hostile {
			if err := n2.log.Measure(rw, 12, []byte("x"), d); err != nil {
				t.Fatal(err)
			}
		}
	})
	if _, err := validator(t, n2, m, &logs).Validate(context.Background(), issue(t, n2), nonce); err != nil {
		t.Fatalf("warn-only mismatch rejected: %v", err)
	}
	if bytes.Contains(logs.Bytes(), []byte(`\x1b`)) || bytes.Contains(logs.Bytes(), []byte("\x1b")) || logs.Len() > 2048 {
		t.Errorf("warn-only log line keeps escapes or is too long (%d bytes):\n%.400s", logs.Len(), logs.String())
	}
}
