package vm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/orrery-dev/orrery/internal/childproc"
)

// probeTimeout bounds the KVM probe's boot: under working KVM the kernel
// prints its first line in well under a second.
const probeTimeout = 5 * time.Second

// Probe decides the accelerator: KVM if /dev/kvm opens and kernel, booted
// under KVM for a moment, prints its first line on the serial console;
// otherwise TCG. A /dev/kvm that exists is not enough: on some machines
// QEMU aborts under KVM or hangs after the BIOS. The reason says why the
// choice fell as it did, for the user to read.
func Probe(ctx context.Context, kernel string) (Accel, string) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return AccelTCG, fmt.Sprintf("KVM unavailable (%v)", err)
	}
	f.Close()
	if kernel == "" {
		return AccelTCG, "no kernel to test KVM with"
	}
	qemu, err := exec.LookPath(QEMUBinary)
	if err != nil {
		return AccelTCG, fmt.Sprintf("cannot test KVM: %v", err)
	}

	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu,
		"-machine", "q35", "-accel", "kvm", "-cpu", "host", "-smp", "1", "-m", "256",
		"-nodefaults", "-no-user-config", "-nographic", "-nic", "none", "-no-reboot",
		"-serial", "stdio",
		"-kernel", kernel, "-append", "console=ttyS0 panic=-1",
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = time.Second
	// A pipe of our own rather than StdoutPipe: childproc waits for QEMU
	// as soon as it starts, and Wait would close StdoutPipe's end under
	// the reader. childproc, because a plain Start binds the SIGKILL to
	// the forking thread, which a network-namespace helper may end: QEMU
	// would die at once and the probe would wrongly say KVM is broken.
	stdout, w, err := os.Pipe()
	if err != nil {
		return AccelTCG, fmt.Sprintf("cannot test KVM: %v", err)
	}
	defer stdout.Close()
	cmd.Stdout = w
	exited, err := childproc.Start(cmd)
	w.Close()
	if err != nil {
		return AccelTCG, fmt.Sprintf("cannot test KVM: %v", err)
	}
	booted := make(chan bool, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			if strings.Contains(s.Text(), "Linux version") {
				booted <- true
				return
			}
		}
		booted <- false
	}()
	ok, done := false, false
	select {
	case ok = <-booted:
		done = true
	case <-ctx.Done():
	}
	_ = cmd.Process.Kill()
	waitErr := <-exited
	if !done {
		<-booted // the pipe ends with QEMU, its only writer
	}
	switch {
	case ok:
		return AccelKVM, "a test kernel booted under KVM"
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return AccelTCG, fmt.Sprintf("KVM does not work: a test kernel printed nothing under KVM within %v", probeTimeout)
	case ctx.Err() != nil:
		return AccelTCG, fmt.Sprintf("KVM probe cancelled: %v", ctx.Err())
	}
	return AccelTCG, fmt.Sprintf("KVM does not work: QEMU failed under KVM: %s (%v)", firstLine(stderr.String()), waitErr)
}

func firstLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	// QEMU's first complaint is the cause; what follows (assertions) is
	// the consequence.
	for _, l := range lines {
		if l = strings.TrimSpace(l); l != "" {
			return l
		}
	}
	return "no output"
}
