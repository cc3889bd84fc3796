package childproc

import (
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

func sleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	t.Cleanup(func() {
		if cmd.Process != nil {
			cmd.Process.Kill()
		}
	})
	return cmd
}

// startOnDyingThread calls start on a goroutine locked to its thread that
// then returns without unlocking: the Go runtime ends that thread, as it
// does after every network-namespace switch of netenv.Network.Do.
func startOnDyingThread(start func()) {
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		start()
		close(done)
	}()
	<-done
}

// alive reports whether cmd's process still runs some time after its
// forking thread may have ended (the signal is asynchronous).
func alive(cmd *exec.Cmd, exited <-chan error) bool {
	select {
	case <-exited:
		return false
	case <-time.After(500 * time.Millisecond):
		return true
	}
}

// The control first: exec.Cmd.Start on such a thread, and the child gets
// its parent-death signal though its parent lives on. Then Start, on the
// same kind of thread, whose child must live on.
func TestChildOutlivesTheThreadThatStartedIt(t *testing.T) {
	plain := sleeper(t)
	var err error
	startOnDyingThread(func() { err = plain.Start() })
	if err != nil {
		t.Fatal(err)
	}
	plainExited := make(chan error, 1)
	go func() { plainExited <- plain.Wait() }()
	if alive(plain, plainExited) {
		t.Fatal("the control lived on: its forking thread did not end, so this test shows nothing (is the main goroutine still locked to the first thread? see init)")
	}

	cmd := sleeper(t)
	var exited <-chan error
	startOnDyingThread(func() { exited, err = Start(cmd) })
	if err != nil {
		t.Fatal(err)
	}
	if !alive(cmd, exited) {
		t.Fatalf("the child died with the thread that started it: %v", <-exited)
	}
	cmd.Process.Kill()
	if err := <-exited; err == nil {
		t.Fatal("a killed child reported success")
	}
}

func TestStartError(t *testing.T) {
	if _, err := Start(exec.Command("/nonexistent/program")); err == nil {
		t.Fatal("starting a missing program succeeded")
	}
}
