package vm

import (
	"os/exec"
	"testing"
)

// A process reniced by 5 runs at this process's niceness plus 5, and one
// reniced far beyond Linux's range at its bound.
func TestRenice(t *testing.T) {
	own, err := niceness(0)
	if err != nil {
		t.Fatal(err)
	}
	if own > 14 {
		t.Skipf("this test runs at niceness %d: no room to lower another process by 5", own)
	}
	for _, c := range []struct{ by, want int }{{5, own + 5}, {100, 19}} {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if err := renice(cmd.Process.Pid, c.by); err != nil {
			t.Fatal(err)
		}
		got, err := niceness(cmd.Process.Pid)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if err != nil || got != c.want {
			t.Errorf("renice by %d: niceness %d (%v), want %d", c.by, got, err, c.want)
		}
	}
}
