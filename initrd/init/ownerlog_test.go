package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/inspectserver"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
	"github.com/orrery-dev/orrery/internal/redact"
)

func collect(t *testing.T, l *lineLog, q inspectserver.Query) []string {
	t.Helper()
	var got []string
	err := l.Read(context.Background(), q, func(es []*inspectpb.JournalEntry) error {
		for _, e := range es {
			got = append(got, e.GetMessage())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestInitrdLogForTheOwner(t *testing.T) {
	c := &console{start: time.Now()}
	for i := range keptLines + 10 {
		c.log("rejoin", "attempt %d", i)
	}
	c.log("kubeadm", "kubeadm join --token abcdef.0123456789abcdef")

	got := collect(t, &c.kept, inspectserver.Query{Lines: 3})
	if len(got) != 3 || got[0] != fmt.Sprintf("rejoin: attempt %d", keptLines+8) || !strings.HasSuffix(got[2], redact.Redacted) {
		t.Fatalf("the newest 3 lines: %q", got)
	}
	// A key logged a line at a time: a window that starts inside it shows
	// none of its body.
	for _, l := range []string{"-----BEGIN EC PRIVATE KEY-----", "MHcCAQEEIBkV3mXq0Qh9aXl2rK0PvWc1s2M1y8i8a0R2e1Zq5m1xoAoGCCqGSM49", "-----END EC PRIVATE KEY-----"} {
		c.kept.add(time.Now(), l)
	}
	if got := collect(t, &c.kept, inspectserver.Query{Lines: 2}); len(got) != 2 || got[0] != redact.Redacted {
		t.Fatalf("a window inside a key: %q", got)
	}
	if got := collect(t, &c.kept, inspectserver.Query{Lines: inspectserver.MaxLines}); len(got) != keptLines {
		t.Fatalf("kept %d lines, want the newest %d", len(got), keptLines)
	}
	for _, q := range []inspectserver.Query{{Kernel: true, Lines: 1}, {Unit: "kubelet.service", Lines: 1}, {Boot: -1, Lines: 1}} {
		if err := c.kept.Read(context.Background(), q, nil); !errors.Is(err, errInitrdJournal) {
			t.Errorf("%+v: %v, want the initrd's refusal", q, err)
		}
	}

	// A follower gets the lines written after it started.
	ctx, cancel := context.WithCancel(context.Background())
	lines := make(chan string, 10)
	done := make(chan error)
	go func() {
		done <- c.kept.Read(ctx, inspectserver.Query{Lines: 1, Follow: true}, func(es []*inspectpb.JournalEntry) error {
			for _, e := range es {
				lines <- e.GetMessage()
			}
			return nil
		})
	}()
	<-lines // the newest line before
	c.log("rejoin", "state disk opened")
	select {
	case l := <-lines:
		if l != "rejoin: state disk opened" {
			t.Fatalf("followed %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a new line did not reach the follower")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
