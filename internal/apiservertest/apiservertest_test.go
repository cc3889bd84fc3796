package apiservertest

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

// fatalRecorder stands in for a test that waitReady fails: it keeps the
// message and ends the goroutine, as t.Fatalf does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// An API server that exits while it starts (CI saw one lose its port) is
// reported as exited, with its log, instead of being waited for a minute.
func TestWaitReadyStopsWhenTheServerExits(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "kube-apiserver.log")
	p := start(t, "/bin/sh", []string{"-c", "echo 'listen tcp 127.0.0.1:1: bind: address already in use'; exit 1"}, logPath)
	cfg := &rest.Config{Host: "https://127.0.0.1:" + strconv.Itoa(freePort(t))}

	r := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		waitReady(r, cfg, p, logPath)
	}()
	<-done
	if !strings.Contains(r.msg, "exited before it was ready") || !strings.Contains(r.msg, "exit status 1") || !strings.Contains(r.msg, "address already in use") {
		t.Fatalf("waitReady said %q, want that the server exited, how, and its log", r.msg)
	}
}
