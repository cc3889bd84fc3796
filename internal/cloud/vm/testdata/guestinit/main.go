// Command guestinit is the /init of the VM test's initramfs. It reports on
// the serial console whether the kernel found the vTPM, in one line that
// the test looks for, and then waits for the test to reset or stop the VM.
package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

// Marker starts the line the test waits for.
const Marker = "ORRERY-VMTEST"

func main() {
	// The kernel mounts nothing for an initramfs's /init.
	for _, m := range []struct{ fstype, target string }{
		{"devtmpfs", "/dev"}, {"proc", "/proc"}, {"sysfs", "/sys"},
	} {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			report("error", fmt.Sprintf("mkdir %s: %v", m.target, err))
		}
		if err := syscall.Mount(m.fstype, m.target, m.fstype, 0, ""); err != nil {
			report("error", fmt.Sprintf("mount %s: %v", m.target, err))
		}
	}
	// The TPM driver probes before /init runs; wait in case it is slow
	// under emulation (5 s once fell short after a reset while a build
	// loaded both host cores).
	deadline := time.Now().Add(20 * time.Second)
	for !exists("/dev/tpm0") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	uptime, _ := os.ReadFile("/proc/uptime")
	report("boot", fmt.Sprintf("tpm0=%s tpmrm0=%s sysfs=%s uptime=%s",
		yesNo(exists("/dev/tpm0")), yesNo(exists("/dev/tpmrm0")), yesNo(exists("/sys/class/tpm/tpm0")),
		strings.Fields(string(uptime) + " ?")[0]))
	// Exiting would panic the kernel: wait for the reset or the kill.
	for {
		time.Sleep(time.Hour)
	}
}

func report(key, value string) {
	line := fmt.Sprintf("%s %s %s\n", Marker, key, value)
	// /dev/console is the serial port (console=ttyS0); fall back to the
	// stdout the kernel gave us if devtmpfs did not come up.
	if f, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
		f.WriteString(line)
		f.Close()
		return
	}
	os.Stdout.WriteString(line)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
