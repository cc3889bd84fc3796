// Command testroot is /sbin/init of the small root filesystem the initrd's
// VM test boots. It reports on the serial console, as lines
// "ORRERY-ROOT <key> <value>", what the initrd left behind: the
// measurement log, PCR 11, the first-boot key and whether /etc and /var
// are writable. Then it powers the VM off.
package main

import (
	"encoding/hex"
	"fmt"
	"os"
	"strings"

	"github.com/google/go-tpm/legacy/tpm2"
	"golang.org/x/sys/unix"
)

func report(key, format string, args ...any) {
	fmt.Printf("ORRERY-ROOT %s %s\n", key, fmt.Sprintf(format, args...))
}

func main() {
	report("pid", "%d", os.Getpid())
	if log, err := os.ReadFile("/run/orrery/measurements.log"); err != nil {
		report("error", "read measurement log: %v", err)
	} else {
		for _, l := range strings.Split(strings.TrimSpace(string(log)), "\n") {
			report("log", "%s", l)
		}
	}
	if rw, err := os.OpenFile("/dev/tpmrm0", os.O_RDWR, 0); err != nil {
		report("error", "open TPM: %v", err)
	} else {
		pcr, err := tpm2.ReadPCR(rw, 11, tpm2.AlgSHA256)
		if err != nil {
			report("error", "read PCR 11: %v", err)
		} else {
			report("pcr11", "%s", hex.EncodeToString(pcr))
		}
		rw.Close()
	}
	if fi, err := os.Stat("/run/orrery/first-boot-key"); err != nil {
		report("error", "first-boot key: %v", err)
	} else {
		report("key", "%d %o", fi.Size(), fi.Mode().Perm())
	}
	for _, f := range []string{"/etc/orrery-test", "/var/orrery-test"} {
		if err := os.WriteFile(f, []byte("ok"), 0o644); err != nil {
			report("error", "write %s: %v", f, err)
		} else {
			report("writable", "%s", f)
		}
	}
	unix.Sync()
	report("done", "powering off")
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}
