// Command testroot is /sbin/init of the small root filesystem the initrd's
// VM test boots. It reports on the serial console, as lines
// "ORRERY-ROOT <key> <value>", what the initrd left behind: the
// measurement log, PCR 11, the first-boot key and whether /etc and /var
// are writable. On a first boot it also hands the state disk over as
// bootstrapperd would take it (see handOff). Then it powers the VM off.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"golang.org/x/sys/unix"

	"github.com/orrery-dev/orrery/internal/disk/handoff"
	"github.com/orrery-dev/orrery/internal/keys"
)

func report(key, format string, args ...any) {
	fmt.Printf("ORRERY-ROOT %s %s\n", key, fmt.Sprintf(format, args...))
}

func main() {
	report("pid", "%d", os.Getpid())
	// What the initrd's clock check left: the clock source, and (last,
	// just before power-off) the wall clock, which the test compares with
	// the host's.
	if src, err := os.ReadFile("/sys/devices/system/clocksource/clocksource0/current_clocksource"); err != nil {
		report("error", "read the clock source: %v", err)
	} else {
		report("clocksource", "%s", strings.TrimSpace(string(src)))
	}
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
		for _, pcr := range []int{11, 15} {
			v, err := tpm2.ReadPCR(rw, pcr, tpm2.AlgSHA256)
			if err != nil {
				report("error", "read PCR %d: %v", pcr, err)
			} else {
				report(fmt.Sprintf("pcr%d", pcr), "%s", hex.EncodeToString(v))
			}
		}
		rw.Close()
	}
	reportFirmwareLog()
	if id, err := os.ReadFile("/etc/machine-id"); err != nil {
		report("error", "read the machine ID: %v", err)
	} else {
		report("machineid", "%s", strings.TrimSpace(string(id)))
	}
	if fi, err := os.Stat(handoff.KeyFile); err != nil {
		report("nokey", "first-boot key: %v", err) // a later boot has none
		reportPlanted()
		plantRefused()
	} else {
		report("key", "%d %o", fi.Size(), fi.Mode().Perm())
		handOff()
		plant()
	}
	for _, f := range []string{"/etc/orrery-test", "/var/orrery-test"} {
		if err := os.WriteFile(f, []byte("ok"), 0o644); err != nil {
			report("error", "write %s: %v", f, err)
		} else {
			report("writable", "%s", f)
		}
	}
	writeCost("/var")
	unix.Sync()
	report("time", "%d", time.Now().Unix())
	report("done", "powering off")
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

// planted are what root on a node would leave for its next boot to run,
// in each place the OS can write: /etc, and /etc/kubernetes, which is kept.
var planted = map[string]string{
	"/etc/systemd/system/backdoor.service":                         "[Service]\nExecStart=/bin/sh -c 'echo owned'\n",
	"/etc/systemd/system/multi-user.target.wants/backdoor.service": "[Service]\nExecStart=/bin/sh -c 'echo owned'\n",
	"/etc/containerd/config.toml":                                  "[plugins]\n",
	"/etc/kubernetes/manifests/backdoor.yaml":                      "apiVersion: v1\nkind: Pod\n",
	"/etc/kubernetes/kubelet.conf.d/exec.conf":                     "users: [{user: {exec: {command: /bin/sh}}}]\n",
	// A name the node keeps, with another CA (attackerCA): a rejoin
	// rewrites it from the join service's ticket.
	"/etc/kubernetes/pki/ca.crt": "",
}

// attackerCA is a CA certificate of root's own, PEM.
func attackerCA() (string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "attacker"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", err
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), nil
}

// plant, on a first boot, plants the files of planted.
func plant() {
	ca, err := attackerCA()
	if err != nil {
		report("error", "make a CA: %v", err)
		return
	}
	planted["/etc/kubernetes/pki/ca.crt"] = ca
	for path, content := range planted {
		err := os.MkdirAll(filepath.Dir(path), 0o755)
		if err == nil {
			err = os.WriteFile(path, []byte(content), 0o644)
		}
		if err != nil {
			report("error", "plant %s: %v", path, err)
		}
	}
	report("planted", "%d files", len(planted))
}

// reportPlanted, on a later boot, reports which planted files are still
// what was planted ("kept") and which are not ("gone"), and what the
// cluster CA certificate is.
func reportPlanted() {
	for path, content := range planted {
		b, err := os.ReadFile(path)
		still := err == nil && string(b) == content
		if path == "/etc/kubernetes/pki/ca.crt" {
			still = err == nil && caName(b) == "attacker"
		}
		if still {
			report("kept", "%s", path)
		} else {
			report("gone", "%s", path)
		}
	}
	if b, err := os.ReadFile("/etc/kubernetes/pki/ca.crt"); err == nil {
		report("cacert", "%s", caName(b))
	}
}

// caName is the common name of the CA certificate in PEM b, "" if it
// holds none.
func caName(b []byte) string {
	if block, _ := pem.Decode(b); block != nil {
		if c, err := x509.ParseCertificate(block.Bytes); err == nil && c.IsCA {
			return c.Subject.CommonName
		}
	}
	return ""
}

// plantRefused, on a later boot, changes kubelet's flags as root on a
// node would to run its own configuration: the next boot must refuse the
// disk.
func plantRefused() {
	const flags = "/var/lib/kubelet/kubeadm-flags.env"
	if err := os.MkdirAll(filepath.Dir(flags), 0o700); err != nil {
		report("error", "plant %s: %v", flags, err)
		return
	}
	if err := os.WriteFile(flags, []byte(`KUBELET_KUBEADM_ARGS="--v=1 --config-dir=/var/lib/kubelet/conf.d"`+"\n"), 0o644); err != nil {
		report("error", "plant %s: %v", flags, err)
		return
	}
	report("planted", "%s", flags)
}

// handOff, on a first boot, reports what bootstrapperd would take over at
// the node's first join: the state disk's passphrase (hex; a test's disk,
// which the test re-keys and whose passphrase it then removes) and the
// initrd's record of the volume. It writes a measurement salt where
// bootstrapperd keeps it and reports it (hex): a later boot reads it.
func handOff() {
	if key, err := os.ReadFile(handoff.KeyFile); err != nil {
		report("error", "read the first-boot key: %v", err)
	} else {
		report("firstbootkey", "%s", hex.EncodeToString(key))
	}
	if record, err := os.ReadFile(handoff.VolumeRecordFile); err != nil {
		report("error", "read the volume record: %v", err)
	} else {
		report("volume", "%s", record)
	}
	salt, err := keys.GenerateSalt(rand.Reader)
	if err == nil {
		err = handoff.WriteMeasurementSalt(handoff.MeasurementSaltFile, salt)
	}
	if err != nil {
		report("error", "write the measurement salt: %v", err)
		return
	}
	report("salt", "%s", hex.EncodeToString(salt))
}

// reportFirmwareLog reports the firmware's TCG event log, base64: a test
// replays it into a host vTPM that must show this VM's PCRs 4 and 9.
func reportFirmwareLog() {
	const path = "/sys/kernel/security/tpm0/binary_bios_measurements"
	if _, err := os.Stat(path); err != nil {
		if err := unix.Mount("securityfs", "/sys/kernel/security", "securityfs", 0, ""); err != nil {
			report("error", "mount securityfs: %v", err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		report("error", "read firmware event log: %v", err)
		return
	}
	report("fwlog", "%s", base64.StdEncoding.EncodeToString(b))
}

// writeCost reports what writing to dir costs, the two ways a node writes
// its state disk: etcd's small synchronous appends (4 KiB, fdatasync each)
// and a layer's worth of sequential data (32 MiB, one fsync). The numbers
// compare state disk formats; the test asserts nothing about them.
func writeCost(dir string) {
	f, err := os.OpenFile(filepath.Join(dir, "orrery-io-test"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		report("error", "io test: %v", err)
		return
	}
	defer f.Close()
	block := make([]byte, 4096)
	const appends = 200
	start := time.Now()
	for i := 0; i < appends; i++ {
		if _, err := f.Write(block); err != nil {
			report("error", "io test: %v", err)
			return
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			report("error", "io test: %v", err)
			return
		}
	}
	report("io", "%d synced 4KiB appends: %s each", appends, (time.Since(start) / appends).Round(time.Microsecond))
	chunk := make([]byte, 1<<20)
	start = time.Now()
	for i := 0; i < 32; i++ {
		if _, err := f.Write(chunk); err != nil {
			report("error", "io test: %v", err)
			return
		}
	}
	if err := f.Sync(); err != nil {
		report("error", "io test: %v", err)
		return
	}
	report("io", "32 MiB sequential + fsync: %s", time.Since(start).Round(time.Millisecond))
}
