package vm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// renice sets process pid's niceness to this process's plus by, within
// Linux's -20..19.
func renice(pid, by int) error {
	own, err := niceness(0)
	if err != nil {
		return err
	}
	nice := min(max(own+by, -20), 19)
	if err := unix.Setpriority(unix.PRIO_PROCESS, pid, nice); err != nil {
		return fmt.Errorf("set the niceness of process %d to %d: %w", pid, nice, err)
	}
	return nil
}

// niceness is process pid's niceness (0: this process's).
func niceness(pid int) (int, error) {
	// The system call answers 20 minus the niceness, never negative.
	raw, err := unix.Getpriority(unix.PRIO_PROCESS, pid)
	if err != nil {
		return 0, fmt.Errorf("read the niceness of process %d: %w", pid, err)
	}
	return 20 - raw, nil
}
