package boottimeline

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var testSteps = []Step{{"one", "first marker"}, {"two", "second marker"}, {"three", "third marker"}}

func appendTo(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls until w has seen step name.
func waitFor(t *testing.T, w *Watch, name string) time.Duration {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if at, ok := w.At(name); ok {
			return at
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("step %q not seen; rows: %v", name, w.Rows())
	return 0
}

func TestFollow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "serial.log")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	powerOn := time.Now()
	// The log does not exist yet when the VM is powered on.
	w := follow(ctx, "node-0", path, powerOn, testSteps, time.Millisecond)

	appendTo(t, path, "firmware noise\n[ 0.1] first mar")
	time.Sleep(20 * time.Millisecond)
	if _, ok := w.At("one"); ok {
		t.Fatal("a half-written line counted as the step")
	}
	appendTo(t, path, "ker split across two writes\n")
	one := waitFor(t, w, "one")
	if one <= 0 {
		t.Errorf("step one at %v, want after power-on", one)
	}
	// A later step that shows first is not lost once the earlier comes.
	time.Sleep(20 * time.Millisecond)
	appendTo(t, path, "third marker\n")
	three := waitFor(t, w, "three")
	time.Sleep(20 * time.Millisecond)
	appendTo(t, path, strings.Repeat("x", 100000)+"\nsecond marker\n")
	two := waitFor(t, w, "two")
	if !(one < three && three < two) {
		t.Errorf("times: one %v, three %v, two %v; want them in the order written", one, three, two)
	}
	select {
	case <-w.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the watch goes on after every step was seen")
	}
	rows := w.Rows()
	if len(rows) != 3 || !strings.HasPrefix(rows[0], "node-0: one\t") || !strings.HasPrefix(rows[1], "node-0: three\t") ||
		!strings.HasPrefix(rows[2], "node-0: two\t") || !strings.Contains(rows[2], "(+") {
		t.Errorf("rows = %q, want one, three, two in the order seen, each with its delta", rows)
	}
}

func TestFollowStopsWithContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "serial.log")
	appendTo(t, path, "first marker\n")
	ctx, cancel := context.WithCancel(context.Background())
	w := follow(ctx, "node-0", path, time.Now(), testSteps, time.Millisecond)
	waitFor(t, w, "one")
	cancel()
	select {
	case <-w.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the watch goes on after its context ended")
	}
	if rows := w.Rows(); len(rows) != 1 {
		t.Errorf("rows = %q, want the one step seen", rows)
	}
}

func TestStepTextsFitTheCarry(t *testing.T) {
	for _, s := range Steps {
		if len(s.Text) >= maxText || s.Text == "" {
			t.Errorf("step %q: text of %d bytes; a read carries %d", s.Name, len(s.Text), maxText)
		}
	}
}
