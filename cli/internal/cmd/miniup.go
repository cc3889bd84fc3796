package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/cloud"
)

// miniOptions are the flags of 'orrery mini up' (and of the supervisor it
// starts, which receives the same flags).
type miniOptions struct {
	dir           string
	controlPlanes int
	workers       int
	cpus          int
	memoryMiB     int
	stateDiskMiB  int
	image         string
	// sevSNP makes the VMs simulated SEV-SNP confidential VMs.
	sevSNP bool
	// Development and test flags: boot a kernel instead of the image, in
	// a network namespace.
	kernel, initrd, cmdline, netns string
	shutdownTimeout                time.Duration
}

func addUpFlags(c *cobra.Command, o *miniOptions) {
	f := c.Flags()
	addDirFlag(c, &o.dir)
	f.IntVar(&o.controlPlanes, "control-planes", 1, "number of control-plane VMs")
	f.IntVar(&o.workers, "workers", 1, "number of worker VMs")
	f.IntVar(&o.cpus, "cpus", 2, "virtual CPUs per VM")
	f.IntVar(&o.memoryMiB, "memory", 3072, "memory per VM in MiB (a control plane needs about 2.5 GiB)")
	f.IntVar(&o.stateDiskMiB, "state-disk-size", 10240, "size of each VM's blank state disk in MiB")
	f.StringVar(&o.image, "image", "build/image/disk.qcow2", "OS image the VMs boot (built by 'make image')")
	f.BoolVar(&o.sevSNP, "sev-snp", false, "make the VMs simulated SEV-SNP confidential VMs: their attestation carries SEV-SNP reports signed by a test root this cloud keeps ("+cloud.SEVSNPTestRoot+" in --mini-dir), not by any real CPU")
	f.StringVar(&o.kernel, "kernel", "", "boot this kernel directly instead of the image (development)")
	f.StringVar(&o.initrd, "initrd", "", "initrd for --kernel")
	f.StringVar(&o.cmdline, "cmdline", "console=ttyS0", "kernel command line for --kernel")
	f.StringVar(&o.netns, "netns", "", "run the cloud in this new network namespace (tests)")
	f.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long 'down' waits for a VM to power off before killing it")
	for _, hidden := range []string{"kernel", "initrd", "cmdline", "netns", "shutdown-timeout"} {
		_ = f.MarkHidden(hidden)
	}
}

// Bounds of the VM flags: what the cloud's network plan and QEMU take,
// and what the image needs to boot into a node.
const (
	maxCPUs      = 64
	minMemoryMiB = 256
	maxMemoryMiB = 1 << 20
	// minStateDiskMiB leaves a node's etcd, journal and pods room to grow
	// (together under 200 MiB through the e2e suite).
	minStateDiskMiB = 2048
	maxStateDiskMiB = 1 << 24
)

// check checks the flags on their own, before anything is started, and
// names every one that is out of range.
func (o miniOptions) check() error {
	var errs []error
	inRange := func(flag string, v, lo, hi int, unit string) {
		if v < lo || v > hi {
			errs = append(errs, fmt.Errorf("--%s %d: want %d to %d%s", flag, v, lo, hi, unit))
		}
	}
	inRange("control-planes", o.controlPlanes, 1, cloud.MaxNodesPerRole, "")
	inRange("workers", o.workers, 0, cloud.MaxNodesPerRole, "")
	inRange("cpus", o.cpus, 1, maxCPUs, "")
	inRange("memory", o.memoryMiB, minMemoryMiB, maxMemoryMiB, " MiB")
	minDisk := minStateDiskMiB
	if o.kernel != "" {
		// A test kernel does not install Kubernetes.
		minDisk = 16
	}
	inRange("state-disk-size", o.stateDiskMiB, minDisk, maxStateDiskMiB, " MiB")
	if o.shutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--shutdown-timeout %s: want a positive duration", o.shutdownTimeout))
	}
	if o.kernel == "" && o.initrd != "" {
		errs = append(errs, errors.New("--initrd needs --kernel"))
	}
	return errors.Join(errs...)
}

func (o miniOptions) spec(progress io.Writer) cloud.Spec {
	s := cloud.Spec{
		Dir:             o.dir,
		ControlPlanes:   o.controlPlanes,
		Workers:         o.workers,
		CPUs:            o.cpus,
		MemoryMiB:       o.memoryMiB,
		StateDiskMiB:    o.stateDiskMiB,
		Namespace:       o.netns,
		ShutdownTimeout: o.shutdownTimeout,
		SEVSNP:          o.sevSNP,
		Progress:        progress,
		// After a failed bring-up the consoles are what tells why.
		KeepLogs: true,
	}
	if o.kernel != "" {
		s.Kernel, s.Initrd, s.Cmdline = o.kernel, o.initrd, o.cmdline
	} else {
		s.Image = o.image
	}
	return s
}

func (o miniOptions) args() []string {
	return []string{
		"--mini-dir", o.dir,
		"--control-planes", strconv.Itoa(o.controlPlanes), "--workers", strconv.Itoa(o.workers),
		"--cpus", strconv.Itoa(o.cpus), "--memory", strconv.Itoa(o.memoryMiB),
		"--state-disk-size", strconv.Itoa(o.stateDiskMiB), "--image", o.image,
		"--kernel", o.kernel, "--initrd", o.initrd, "--cmdline", o.cmdline, "--netns", o.netns,
		"--shutdown-timeout", o.shutdownTimeout.String(),
		"--sev-snp=" + strconv.FormatBool(o.sevSNP),
	}
}

func newMiniUpCmd() *cobra.Command {
	var o miniOptions
	c := &cobra.Command{
		Use:   "up",
		Short: "Start the local cloud's VMs",
		Example: `  sudo orrery mini up
  sudo orrery mini up --control-planes 1 --workers 2 --memory 3072`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runMiniUp(cmd.Context(), cmd.OutOrStdout(), o) },
	}
	addUpFlags(c, &o)
	return c
}

// runMiniUp starts the cloud in a supervisor process ('orrery mini serve'
// with the same flags) that runs in the background, and returns once every
// VM runs.
func runMiniUp(ctx context.Context, out io.Writer, o miniOptions) error {
	if err := o.check(); err != nil {
		return err
	}
	// Absolute, because the supervisor records them for 'mini start',
	// which may run from another directory.
	for _, p := range []*string{&o.dir, &o.image, &o.kernel, &o.initrd} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		*p = abs
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	st, err := cloud.StartSupervised(ctx, o.spec(nil), append([]string{self, "mini", "serve"}, o.args()...), out)
	if err != nil {
		return err
	}
	printNodes(out, st)
	fmt.Fprintf(out, "\nThe local cloud runs. Platform CA: %s; init secret: %s\n",
		filepath.Join(o.dir, cloud.PlatformCACert), filepath.Join(o.dir, cloud.InitSecretFile))
	sudo := sudoPrefix(os.Geteuid(), os.Getenv("SUDO_USER"))
	if o.sevSNP {
		fmt.Fprintf(out, "The VMs are simulated SEV-SNP VMs: their reports are signed by this cloud's test root, not by a real CPU.\n"+
			"To accept them, check nodes against the image's SEV-SNP measurements and name the test root:\n"+
			"  --measurements build/image/measurements-sev-snp.json --snp-test-root %s\n", filepath.Join(o.dir, cloud.SEVSNPTestRoot))
	}
	fmt.Fprintf(out, "Power it off with '%sorrery mini stop --mini-dir %s' (keeps the disks) or '%sorrery mini down --mini-dir %s' (deletes them).\n", sudo, o.dir, sudo, o.dir)
	return nil
}
