package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/cloud/vm"
	"github.com/orrery-dev/orrery/internal/role"
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

func newMiniCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "mini",
		Short: "Run a local Orrery cluster in QEMU VMs with vTPMs on this machine",
		Long: `mini runs a local cloud on this machine: QEMU VMs booting the Orrery image
(UEFI, a swtpm vTPM each, certified by a local platform CA), a bridge
network with DHCP and a metadata API. Everything lives in one state
directory (./orrery-mini by default): logs, state, the VMs' disks and
vTPMs, the init secret and the platform CA certificate. It needs root
(bridges, taps).

  up      make the VMs and start them
  stop    power them off, keeping their disks
  start   boot the stopped VMs again from their disks
  down    power them off and delete their disks
  status  list the VMs`,
	}
	c.AddCommand(newMiniUpCmd(), newMiniStopCmd(), newMiniStartCmd(), newMiniDownCmd(), newMiniStatusCmd(), newMiniServeCmd())
	return c
}

// addDirFlag adds --mini-dir, the name every command uses for the local
// cloud's directory; 'mini' commands took --dir before.
func addDirFlag(c *cobra.Command, dir *string) {
	c.Flags().StringVar(dir, "mini-dir", "orrery-mini", "state directory of the local cloud")
	c.Flags().StringVar(dir, "dir", "orrery-mini", "state directory of the local cloud")
	_ = c.Flags().MarkDeprecated("dir", "use --mini-dir")
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

func newMiniServeCmd() *cobra.Command {
	var (
		o      miniOptions
		resume bool
	)
	c := &cobra.Command{
		Use:    "serve",
		Short:  "Run the local cloud in the foreground (started by 'mini up' and 'mini start')",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// SIGTERM from 'mini stop', 'mini down' or 'mini up' on Ctrl-C
			// stops it in order; 'mini down' then deletes the files.
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			var (
				c   *cloud.Cloud
				err error
			)
			if resume {
				c, err = cloud.Resume(ctx, o.dir, cmd.OutOrStdout())
			} else {
				c, err = cloud.Up(ctx, o.spec(cmd.OutOrStdout()))
			}
			if err != nil {
				return err
			}
			if accel, _ := c.Accel(); accel == vm.AccelTCG {
				if err := cloud.RaiseSessionPriority(); err != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "warning: %v; on a busy host the control plane may not keep up\n", err)
				}
			}
			<-ctx.Done()
			return c.Stop(context.Background())
		},
	}
	addUpFlags(c, &o)
	c.Flags().BoolVar(&resume, "resume", false, "start the stopped cloud in --mini-dir again; the other flags are ignored")
	return c
}

func newMiniStopCmd() *cobra.Command {
	var dir string
	c := &cobra.Command{
		Use:   "stop",
		Short: "Power the local cloud's VMs off and keep their disks",
		Long: `stop powers off the VMs of the local cloud in --mini-dir (each gets the
shutdown timeout to power off, then it is cut) and stops its network and
services. It keeps everything on disk: the VMs' disks and vTPMs, the init
secret and the platform CA. 'orrery mini start' boots the same VMs again;
'orrery mini down' deletes them.`,
		Example: "  orrery mini stop\n  orrery mini start",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if _, err := cloud.ReadState(dir); errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("no local cloud in %s: nothing to stop", dir)
			}
			fmt.Fprintf(out, "Stopping the local cloud in %s...\n", dir)
			already, err := cloud.StopDir(cmd.Context(), dir)
			if err != nil {
				return err
			}
			if already {
				fmt.Fprintln(out, "It was stopped already.")
			}
			sudo := sudoPrefix(os.Geteuid(), os.Getenv("SUDO_USER"))
			fmt.Fprintf(out, "The local cloud is stopped; its VMs' disks and vTPMs are kept.\n"+
				"'%sorrery mini start --mini-dir %s' boots them again; '%sorrery mini down --mini-dir %s' deletes them.\n", sudo, dir, sudo, dir)
			return nil
		},
	}
	addDirFlag(c, &dir)
	return c
}

func newMiniStartCmd() *cobra.Command {
	var dir string
	c := &cobra.Command{
		Use:   "start",
		Short: "Boot the stopped local cloud's VMs again from their disks",
		Long: `start boots the VMs that 'orrery mini stop' powered off, with their disks,
vTPMs, names and addresses, and the cloud's network and services.

A node that belongs to a cluster comes back on its own when the cluster's
join service answers it: workers rejoin once a control plane runs. When
every control plane was stopped, none has a join service to ask: each
waits in its initrd for its owner, who unlocks it with 'orrery recover'
(from the workspace, with the cluster's master secret).`,
		Example: `  orrery mini start
  orrery recover --node 10.42.1.100    # then, for each control plane`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			abs, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			st, err := cloud.ResumeSupervised(cmd.Context(), abs, []string{self, "mini", "serve", "--resume", "--mini-dir", abs}, out)
			if err != nil {
				return err
			}
			printNodes(out, st)
			fmt.Fprintln(out, "\nThe local cloud runs again. Workers rejoin their cluster once a control plane runs;")
			fmt.Fprintln(out, "a control plane whose cluster has no other waits for its owner: run, from the workspace,")
			for _, line := range recoverHints(st, abs) {
				fmt.Fprintln(out, "  "+line)
			}
			fmt.Fprintln(out, "A node never initialised waits for 'orrery init' as before; its init secret is unchanged.")
			return nil
		},
	}
	addDirFlag(c, &dir)
	return c
}

func newMiniDownCmd() *cobra.Command {
	var (
		dir string
		yes bool
	)
	c := &cobra.Command{
		Use:   "down",
		Short: "Stop the local cloud and delete its VMs' disks",
		Long: `down stops the VMs, the network and the services of the local cloud in
--mini-dir, also after a crash, and deletes the VMs' disks, their vTPM state
and the init secret: the cluster on them is gone for good ('orrery mini
stop' keeps them). It asks first, unless --yes. The VMs' logs (<dir>/<vm>/serial.log, qemu.log) stay for
reading afterwards, and so does the platform CA, so that the next 'mini up'
certifies its VMs with the same CA. The owner's workspace (master secret,
kubeconfig) is not touched: the next 'orrery init' there needs
--replace-workspace, or another --workspace.`,
		Example: "  orrery mini down\n  orrery mini down --yes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := cloud.ReadState(dir)
			if errors.Is(err, os.ErrNotExist) {
				fmt.Fprintf(cmd.OutOrStdout(), "No local cloud recorded in %s: nothing to do.\n", dir)
				return nil
			}
			if !yes {
				var names []string
				for _, n := range st.Nodes {
					names = append(names, n.Name)
				}
				ok, err := confirm(cmd.InOrStdin(), cmd.OutOrStdout(), fmt.Sprintf("Delete the VMs %s of %s with their disks and vTPMs?", strings.Join(names, ", "), dir))
				if err != nil {
					return err
				}
				if !ok {
					return errors.New("nothing deleted")
				}
			}
			if err := cloud.Cleanup(cmd.Context(), dir); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "The local cloud is down.")
			return nil
		},
	}
	addDirFlag(c, &dir)
	c.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask before deleting the VMs' disks")
	return c
}

// recoverHints are the 'orrery recover' commands that unlock the control
// planes of the cloud in dir, with the measurements beside the image it
// boots and, for simulated SEV-SNP VMs, the cloud's test root (recover
// takes no test root it is not given).
func recoverHints(st cloud.State, dir string) []string {
	var checks string
	if st.Spec.Image != "" {
		name := "measurements.json"
		if st.Spec.SEVSNP {
			name = "measurements-sev-snp.json"
		}
		checks = " --measurements " + filepath.Join(filepath.Dir(st.Spec.Image), name)
	}
	if st.Spec.SEVSNP {
		checks += " --snp-test-root " + filepath.Join(dir, cloud.SEVSNPTestRoot)
	}
	var hints []string
	for _, n := range st.Nodes {
		if n.Role == role.ControlPlane {
			hints = append(hints, fmt.Sprintf("orrery recover --node %s --mini-dir %s%s", n.IP, dir, checks))
		}
	}
	return hints
}

func newMiniStatusCmd() *cobra.Command {
	var dir, output string
	c := &cobra.Command{
		Use:     "status",
		Short:   "Show the local cloud's VMs, roles, addresses and uptime",
		Long:    "status lists the local cloud's VMs: their roles, addresses, state, uptime and console logs.",
		Example: "  orrery mini status\n  orrery mini status -o jsonpath='{.nodes[*].ip}'",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			st, err := cloud.ReadState(dir)
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("no local cloud in %s: start one with '%sorrery mini up'", dir, sudoPrefix(os.Geteuid(), os.Getenv("SUDO_USER")))
			}
			if err != nil {
				return err
			}
			if output != "text" {
				return writeData(cmd.OutOrStdout(), output, newMiniReport(st))
			}
			printNodes(cmd.OutOrStdout(), st)
			return nil
		},
	}
	addDirFlag(c, &dir)
	addOutputFlag(c, &output)
	describeOutput(c, miniReport{})
	return c
}

// miniReport is 'mini status' as data.
type miniReport struct {
	// Phase is starting, up or stopped.
	Phase       string         `json:"phase"`
	Accelerator string         `json:"accelerator"`
	Started     time.Time      `json:"started"`
	Stopped     time.Time      `json:"stopped,omitzero"`
	Nodes       []miniNodeInfo `json:"nodes"`
}

type miniNodeInfo struct {
	Name          string `json:"name"`
	Role          string `json:"role"`
	IP            string `json:"ip"`
	Running       bool   `json:"running"`
	UptimeSeconds int64  `json:"uptimeSeconds"`
	SerialLog     string `json:"serialLog"`
}

func newMiniReport(st cloud.State) miniReport {
	r := miniReport{Phase: st.Phase, Accelerator: fmt.Sprint(st.Accel), Started: st.Started.UTC(), Nodes: []miniNodeInfo{}}
	if !st.Stopped.IsZero() {
		r.Stopped = st.Stopped.UTC()
	}
	for _, n := range st.Nodes {
		d, running := n.Uptime()
		r.Nodes = append(r.Nodes, miniNodeInfo{Name: n.Name, Role: string(n.Role), IP: n.IP.String(), Running: running, UptimeSeconds: int64(d.Seconds()), SerialLog: n.SerialLog()})
	}
	return r
}

// sudoPrefix is what a command that needs root is prefixed with in a hint:
// "sudo " for a user who ran this through sudo or as themselves, nothing
// for root itself (a fresh machine may run everything as root and have
// no sudo installed).
func sudoPrefix(euid int, sudoUser string) string {
	if euid == 0 && sudoUser == "" {
		return ""
	}
	return "sudo "
}

func printNodes(out io.Writer, st cloud.State) {
	if st.Phase == cloud.PhaseStopped {
		fmt.Fprintf(out, "\nStopped %s, disks kept: 'orrery mini start' boots the VMs again\n", st.Stopped.Format(time.RFC3339))
	} else {
		fmt.Fprintf(out, "\nAccelerator: %s; started %s\n", st.Accel, st.Started.Format(time.RFC3339))
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tROLE\tIP\tSTATE\tUPTIME\tSERIAL LOG")
	for _, n := range st.Nodes {
		state, uptime := "stopped", "-"
		if d, ok := n.Uptime(); ok {
			state, uptime = "running", d.Round(time.Second).String()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Role, n.IP, state, uptime, n.SerialLog())
	}
	w.Flush()
}
