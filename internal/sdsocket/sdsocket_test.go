package sdsocket

import (
	"strings"
	"testing"
)

func TestListen(t *testing.T) {
	lis, err := Listen("127.0.0.1:0", "x.socket")
	if err != nil {
		t.Fatal(err)
	}
	lis.Close()
	// Not started by systemd: no LISTEN_FDS.
	t.Setenv("LISTEN_FDS", "")
	if _, err := Listen("", "orrery-inspectd.socket"); err == nil || !strings.Contains(err.Error(), "orrery-inspectd.socket") || !strings.Contains(err.Error(), "--listen") {
		t.Fatalf("without a socket from systemd: %v", err)
	}
	if _, err := Listen("256.0.0.1:1", "x.socket"); err == nil {
		t.Fatal("listened on a bad address")
	}
}
