package apiservertest

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

// An API server that exits while it starts is reported as exited, with
// its log, instead of being waited for a minute; one that lost its port
// (CI saw that) is told apart, so that Start tries another port.
func TestWaitReadyStopsWhenTheServerExits(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:" + strconv.Itoa(freePort(t))}

	logPath := filepath.Join(t.TempDir(), "kube-apiserver.log")
	p := start(t, "/bin/sh", []string{"-c", "echo 'listen tcp 127.0.0.1:1: bind: address already in use'; exit 1"}, logPath)
	if err := waitReady(cfg, p, logPath); !errors.Is(err, errPortTaken) {
		t.Fatalf("a server that lost its port: %v, want errPortTaken", err)
	}

	logPath = filepath.Join(t.TempDir(), "kube-apiserver.log")
	p = start(t, "/bin/sh", []string{"-c", "echo 'unknown flag: --banana'; exit 1"}, logPath)
	err := waitReady(cfg, p, logPath)
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") || !strings.Contains(err.Error(), "exit status 1") || !strings.Contains(err.Error(), "--banana") {
		t.Fatalf("waitReady said %v, want that the server exited, how, and its log", err)
	}
}
