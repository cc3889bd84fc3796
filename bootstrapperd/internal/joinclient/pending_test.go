package joinclient

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/pendingjoin"
	"github.com/orrery-dev/orrery/internal/role"
	"github.com/orrery-dev/orrery/internal/testkit/syncbuffer"
)

// A reboot between the node lock and the end of kubeadm join: the node
// comes back locked (its initrd rejoined), no join service will give it
// another ticket, and bootstrapperd finishes the join with the one it
// kept.
func TestInterruptedJoinFinishesAfterReboot(t *testing.T) {
	cfg, _, l, d, j := setup(t, role.ControlPlane, ticket(), false)
	j.fail = 1 << 30 // kubeadm join never gets through before the "reboot"
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for len(j.attemptsSoFar()) == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	if err := Run(ctx, cfg); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want cancelled", err)
	}
	if l.free || !pendingjoin.Exists(cfg.StateDir) {
		t.Fatalf("after the lock: locked %v, ticket kept %v; want both", !l.free, pendingjoin.Exists(cfg.StateDir))
	}
	if fi, err := os.Stat(filepath.Join(cfg.StateDir, pendingjoin.File)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kept ticket: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}
	first := j.attemptsSoFar()[0]

	// The reboot: the same state disk and lock; a fresh daemon with no
	// join service reachable at all.
	j.fail, j.resets, j.attempts = 0, 0, nil
	cfg.dialNet = nil
	cfg.Metadata = meta{self: cfg.Metadata.(meta).self}
	if err := Finish(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if j.resets != 1 || j.p == nil {
		t.Fatalf("kubeadm reset ran %d times, joined %v; want a reset, then the join", j.resets, j.p != nil)
	}
	if !bytes.Equal(j.p.ClientKey, first.ClientKey) || !bytes.Equal(j.p.ClientCert, first.ClientCert) || j.p.Endpoint != first.Endpoint || !j.p.ControlPlane {
		t.Fatal("the finished join used another key, certificate or endpoint than the interrupted one")
	}
	if !bytes.Equal(d.key, ticket().GetStateDiskKey()) {
		t.Fatal("disk key changed")
	}
	if pendingjoin.Exists(cfg.StateDir) {
		t.Fatal("the ticket is still kept after the join finished")
	}
	if err := Finish(context.Background(), cfg); !errors.Is(err, ErrNoPendingJoin) {
		t.Fatalf("second Finish = %v, want ErrNoPendingJoin", err)
	}
}

func TestFinishRefusesDamagedRecord(t *testing.T) {
	cfg, _, l, _, j := setup(t, role.Worker, ticket(), false)
	l.free, l.id = false, []byte("cluster")
	for name, content := range map[string]string{
		"truncated":    `{"ticket":"CiA`,
		"not a ticket": `{"ticket":"/////w==","clientKey":"eA=="}`,
		"no key":       `{"ticket":""}`,
	} {
		if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cfg.StateDir, pendingjoin.File), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		err := Finish(context.Background(), cfg)
		if err == nil || errors.Is(err, ErrNoPendingJoin) || !strings.Contains(err.Error(), pendingjoin.File) {
			t.Errorf("%s: Finish = %v, want an error naming the record", name, err)
		}
		if j.resets != 0 || len(j.attempts) != 0 {
			t.Fatalf("%s: a damaged record led to kubeadm", name)
		}
	}
}

// A join the owner's init overtook leaves no ticket behind.
func TestLockLostRemovesTicket(t *testing.T) {
	cfg, _, l, _, _ := setup(t, role.Worker, ticket(), false)
	l.free, l.id = false, []byte("another cluster")
	if err := Run(context.Background(), cfg); !errors.Is(err, ErrLockLost) {
		t.Fatalf("err = %v, want ErrLockLost", err)
	}
	if pendingjoin.Exists(cfg.StateDir) {
		t.Fatal("a ticket of a cluster the node never joined is kept")
	}
}

// Operators and the e2e suite read this line on the console while a node
// waits for its cluster's join service.
func TestWaitingForTicketIsLogged(t *testing.T) {
	cfg, _, _, _, _ := setup(t, role.Worker, ticket(), true)
	var logs syncbuffer.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	if err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "no join ticket yet; retrying") {
		t.Fatalf("log lacks the waiting line:\n%s", logs.String())
	}
}

// A node whose join service was down and then refuses it says so when
// the reason changes, not only at the first and every tenth attempt: the
// e2e suite and operators tell "down" from "refused" by these lines.
func TestRetryLogsEachNewReason(t *testing.T) {
	reasons := []string{"cp-0: connection refused", "cp-0: connection refused", "cp-0: connection refused", "cp-0: refused this node: PCR 4 mismatch"}
	var logs syncbuffer.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	n := 0
	err := retry(context.Background(), Config{Retry: time.Millisecond, MaxRetry: time.Millisecond, after: time.After}, log, "no join ticket yet; retrying", func() error {
		if n == len(reasons) {
			return nil
		}
		n++
		return errors.New(reasons[n-1])
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "attempt=1 ") || !strings.Contains(lines[0], "connection refused") ||
		!strings.Contains(lines[1], "attempt=4 ") || !strings.Contains(lines[1], "PCR 4 mismatch") {
		t.Fatalf("want the first attempt's and the fourth's (new) reason logged, once each; got:\n%s", logs.String())
	}
}
