// Package cloud is the local cloud: QEMU VMs with swtpm vTPMs on a bridge
// network, with the services a cloud provider runs for its VMs (DHCP, the
// metadata API, vTPM attestation keys certified by a platform CA). `orrery
// mini` and the end-to-end suites drive it.
//
// Up creates everything and Down removes it again; Up removes what it
// created when it fails or its context is cancelled. A crashed run's
// leftovers are listed in the state file and removed by Cleanup (which
// `orrery mini down` calls).
package cloud

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/snp/launch"
	"github.com/orrery-dev/orrery/internal/attestation/snp/snpsim"
	"github.com/orrery-dev/orrery/internal/cloud/dhcpd"
	"github.com/orrery-dev/orrery/internal/cloud/loadbalancer"
	"github.com/orrery-dev/orrery/internal/cloud/metadataserver"
	"github.com/orrery-dev/orrery/internal/cloud/netenv"
	"github.com/orrery-dev/orrery/internal/cloud/vm"
	"github.com/orrery-dev/orrery/internal/clusternet"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/nodepackages"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/role"
)

// The cloud's network plan: control planes and workers get addresses from
// distinct ranges, so an address tells the role.
var (
	Gateway    = netip.MustParsePrefix("10.42.0.1/16")
	MetadataIP = netip.MustParseAddr(metadata.Address)
	// LoadBalancerIP is the cloud's load balancer in front of the control
	// planes: the cluster's stable endpoint, as a real cloud's passthrough
	// network load balancer is.
	LoadBalancerIP = netip.MustParseAddr("10.42.0.2")
	firstCP        = netip.MustParseAddr("10.42.1.100")
	firstWorker    = netip.MustParseAddr("10.42.2.100")
	DefaultBridge  = "orrery0"
)

// Files in the state directory.
const (
	StateFile      = "state.json"
	LockFile       = "lock"
	InitSecretFile = "init-secret"
	PlatformCACert = platformca.CertFile
	// LoadBalancerDir holds the load balancer's configuration, admin
	// socket and log.
	LoadBalancerDir = "loadbalancer"
	// SEVSNPTestRoot is the file, written with Spec.SEVSNP, that names
	// the simulated chip's test root for the owner (orrery init
	// --snp-test-root).
	SEVSNPTestRoot = "snp-test-root.json"
)

// Spec describes a cloud to bring up.
type Spec struct {
	// Dir is the state directory: state file, lock, platform CA, init
	// secret, one directory per VM (disks, vTPM, serial log). Required.
	Dir string `json:"dir"`
	// ControlPlanes and Workers are the node counts (ControlPlanes >= 1).
	ControlPlanes int `json:"controlPlanes"`
	Workers       int `json:"workers"`
	// Spares are further worker slots, addressed, leased and known to the
	// metadata service like workers, that Up does not start: StartSpare
	// boots one later, from an image of the caller's choice (the
	// end-to-end suite boots a modified image next to a running cluster).
	Spares int `json:"spares,omitempty"`
	// CPUs and MemoryMiB size each VM. Zero means 2 CPUs, 2048 MiB.
	CPUs      int `json:"cpus"`
	MemoryMiB int `json:"memoryMiB"`
	// StateDiskMiB is the size of each VM's blank state disk; zero, none.
	StateDiskMiB int `json:"stateDiskMiB"`
	// Image is the disk image VMs boot with UEFI. Alternatively Kernel,
	// Initrd and Cmdline boot a kernel directly (tests).
	Image   string `json:"image,omitempty"`
	Kernel  string `json:"kernel,omitempty"`
	Initrd  string `json:"initrd,omitempty"`
	Cmdline string `json:"cmdline,omitempty"`
	// Namespace, if set, puts the network and the VMs in a network
	// namespace of that name (the test suites do); empty uses the host's,
	// so the owner can reach the nodes.
	Namespace string `json:"namespace,omitempty"`
	// Bridge names the bridge; empty means DefaultBridge.
	Bridge string `json:"bridge"`
	// Accel forces an accelerator; the zero value probes for KVM.
	Accel vm.Accel `json:"accel,omitempty"`
	// ShutdownTimeout is how long Down waits for a VM to power off after
	// the ACPI power button before it kills it. Zero means 30 s.
	ShutdownTimeout time.Duration `json:"shutdownTimeout"`
	// KeepLogs keeps the VMs' serial logs in Dir after Down.
	KeepLogs bool `json:"keepLogs,omitempty"`
	// SEVSNP makes every VM a simulated SEV-SNP confidential VM: the
	// metadata service plays its AMD Secure Processor (package snpsim),
	// signing reports whose launch measurement is that of the firmware
	// the VMs boot, under a test root the cloud keeps in Dir (and
	// writes for the owner as SEVSNPTestRoot).
	SEVSNP bool `json:"sevSnp,omitempty"`
	// LoadBalancerPorts are the ports the load balancer at
	// LoadBalancerIP forwards to the same port of every control plane;
	// nil means DefaultLoadBalancerPorts.
	LoadBalancerPorts []uint16 `json:"loadBalancerPorts,omitempty"`
	// Progress receives one line per step; nil discards.
	Progress io.Writer `json:"-"`
}

// Node is one VM of the cloud.
type Node struct {
	Name string     `json:"name"`
	Role role.Role  `json:"role"`
	IP   netip.Addr `json:"ip"`
	MAC  string     `json:"mac"`
	Tap  string     `json:"tap"`
	Dir  string     `json:"dir"`
	PID  int        `json:"pid"`
	// Spare marks a slot Up did not start (see Spec.Spares).
	Spare bool `json:"spare,omitempty"`
	// SEVSNPDebug makes the node's SEV-SNP reports carry the debug
	// policy bit (see SetSEVSNPDebug).
	SEVSNPDebug bool `json:"sevSnpDebug,omitempty"`
	// Started is when the VM was last powered on.
	Started time.Time `json:"started,omitzero"`
	// Image is the disk image the VM was first started from, and
	// ImageStamp its size and modification time then: the VM's OS disk is
	// an overlay of that file, which must not change while the VM's disks
	// are kept (see Stop).
	Image      string `json:"image,omitempty"`
	ImageStamp string `json:"imageStamp,omitempty"`

	vm *vm.VM
}

// SerialLog is the path of the node's serial console log.
func (n *Node) SerialLog() string { return filepath.Join(n.Dir, "serial.log") }

// VM is the node's VM, for control through QMP.
func (n *Node) VM() *vm.VM { return n.vm }

// Cloud is a running local cloud.
type Cloud struct {
	spec    Spec
	accel   vm.Accel
	why     string
	started time.Time
	stopped time.Time
	lock    *os.File
	network *netenv.Network
	dhcp    *dhcpd.Server
	meta    *http.Server
	lb      *loadbalancer.Balancer
	ca      *platformca.CA
	nodes   []*Node
	// chip and launch are the simulated SEV-SNP chip and the VMs'
	// launch measurement, with Spec.SEVSNP.
	chip   *snpsim.Chip
	launch [launch.Size]byte

	phase  string
	mu     sync.Mutex
	leases map[string]bool
	leased chan struct{}
}

// Up brings up the cloud described by spec.
func Up(ctx context.Context, spec Spec) (_ *Cloud, err error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	spec = spec.withDefaults()
	if err := makeDir(spec.Dir); err != nil {
		return nil, err
	}
	c := &Cloud{spec: spec, started: time.Now(), phase: PhaseStarting, leases: map[string]bool{}, leased: make(chan struct{})}
	if err := c.takeLock(); err != nil {
		return nil, err
	}
	// Before the clean-up below is armed: a cloud recorded here, stopped
	// or crashed, has disks that the clean-up would delete.
	if st, err := readState(spec.Dir); err == nil {
		c.lock.Close()
		return nil, errRecordedCloud(spec.Dir, st)
	} else if !errors.Is(err, os.ErrNotExist) {
		c.lock.Close()
		return nil, err
	}
	defer func() {
		if err != nil {
			c.progress("bring-up failed, removing what was created: %v", err)
			_ = c.Down(context.Background())
		}
	}()

	if err := c.prepare(ctx); err != nil {
		return nil, err
	}
	hash, err := c.initSecret()
	if err != nil {
		return nil, fmt.Errorf("init secret: %w", err)
	}
	c.planNodes()
	if err := c.boot(ctx, hash); err != nil {
		return nil, err
	}
	c.progress("up: %d VMs in %s", len(c.nodes), time.Since(c.started).Round(100*time.Millisecond))
	return c, nil
}

// prepare loads (or makes) what the cloud's VMs are attested by, the
// platform CA and the simulated SEV-SNP chip, and chooses the
// accelerator.
func (c *Cloud) prepare(ctx context.Context) (err error) {
	if c.ca, err = c.platformCA(); err != nil {
		return fmt.Errorf("platform CA: %w", err)
	}
	if c.spec.SEVSNP {
		if err := c.startChip(); err != nil {
			return fmt.Errorf("simulated SEV-SNP chip: %w", err)
		}
	}
	c.accel, c.why = c.spec.Accel, "forced"
	if c.accel == "" {
		c.accel, c.why = vm.Probe(ctx, c.spec.probeKernel())
	}
	c.progress("accelerator: %s (%s)", c.accel, c.why)
	return nil
}

// boot starts the network and services, whose metadata API publishes
// initSecretHash, and the VMs, and records the cloud as up.
func (c *Cloud) boot(ctx context.Context, initSecretHash []byte) error {
	if err := c.startNetwork(ctx, initSecretHash); err != nil {
		return err
	}
	if err := c.startLoadBalancer(ctx); err != nil {
		return err
	}
	if err := c.startVMs(ctx); err != nil {
		return err
	}
	c.phase = PhaseUp
	if err := c.writeState(); err != nil {
		return fmt.Errorf("record the cloud's state: %w", err)
	}
	return nil
}

// withDefaults fills in the zero fields of s.
func (s Spec) withDefaults() Spec {
	if s.Bridge == "" {
		s.Bridge = DefaultBridge
	}
	if s.CPUs == 0 {
		s.CPUs = 2
	}
	if s.MemoryMiB == 0 {
		s.MemoryMiB = 2048
	}
	if s.ShutdownTimeout == 0 {
		s.ShutdownTimeout = 30 * time.Second
	}
	return s
}

// startNetwork creates the bridge, a tap per node and the cloud's DHCP and
// metadata services; the state file records each as it comes, so that
// Cleanup finds it after a crash.
func (c *Cloud) startNetwork(ctx context.Context, initSecretHash []byte) error {
	c.progress("network: bridge %s %s (namespace %q)", c.spec.Bridge, Gateway, c.spec.Namespace)
	var err error
	c.network, err = netenv.Create(ctx, netenv.Config{Namespace: c.spec.Namespace, Bridge: c.spec.Bridge, Gateway: Gateway, MetadataIP: MetadataIP, LoadBalancerIP: LoadBalancerIP})
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	if err := c.writeState(); err != nil {
		return fmt.Errorf("record the cloud's state: %w", err)
	}
	for _, n := range c.nodes {
		if err := c.network.AddTap(ctx, n.Tap); err != nil {
			return fmt.Errorf("network of %s: %w", n.Name, err)
		}
	}
	if err := c.startServices(ctx, initSecretHash); err != nil {
		return fmt.Errorf("DHCP and metadata services: %w", err)
	}
	if err := c.writeState(); err != nil {
		return fmt.Errorf("record the cloud's state: %w", err)
	}
	return nil
}

// DefaultLoadBalancerPorts are what the load balancer forwards to every
// control plane: the API server and the join service.
var DefaultLoadBalancerPorts = []uint16{clusternet.APIServerPort, joinpb.Port}

// startLoadBalancer starts HAProxy in front of the control planes.
func (c *Cloud) startLoadBalancer(ctx context.Context) error {
	var backends []loadbalancer.Backend
	for _, n := range c.nodes {
		if n.Role == role.ControlPlane {
			backends = append(backends, loadbalancer.Backend{Name: n.Name, Addr: n.IP})
		}
	}
	ports := c.spec.LoadBalancerPorts
	if ports == nil {
		ports = DefaultLoadBalancerPorts
	}
	lb, err := loadbalancer.Start(ctx, loadbalancer.Config{
		Dir: filepath.Join(c.spec.Dir, LoadBalancerDir), Address: LoadBalancerIP, Ports: ports,
		Backends: backends, ExecPrefix: c.network.ExecPrefix(),
		// As a real cloud's health check asks the API server; anonymous
		// requests may read /readyz (kubeadm's RBAC).
		ReadyPaths: map[uint16]string{clusternet.APIServerPort: "/readyz"},
	})
	if err != nil {
		return fmt.Errorf("load balancer: %w", err)
	}
	c.lb = lb
	c.progress("load balancer: %s, ports %v to %d control planes", LoadBalancerIP, ports, len(backends))
	return nil
}

// startVMs boots every node but the spares.
func (c *Cloud) startVMs(ctx context.Context) error {
	for _, n := range c.nodes {
		if err := ctx.Err(); err != nil {
			return err
		}
		if n.Spare {
			continue
		}
		image := c.spec.Image
		if n.Image != "" {
			// A restarted spare boots what it first booted.
			image = n.Image
		}
		if err := c.startVM(ctx, n, image, c.defaultNice(n)); err != nil {
			return err
		}
	}
	return nil
}

// startVM boots node n from image (or the spec's kernel), its QEMU and
// swtpm at niceness nice relative to this process.
func (c *Cloud) startVM(ctx context.Context, n *Node, image string, nice int) error {
	c.progress("vm %s (%s, %s): starting", n.Name, n.Role, n.IP)
	stamp, err := imageStamp(image)
	if err != nil {
		return fmt.Errorf("start VM %s: %w", n.Name, err)
	}
	if n.ImageStamp != "" && (n.Image != image || n.ImageStamp != stamp) {
		return fmt.Errorf("start VM %s: its OS disk is an overlay of %s as it was when the VM was made, and that file changed since (%s, was %s): 'orrery mini down' deletes the old VMs, 'orrery mini up' makes new ones from the new image",
			n.Name, n.Image, stamp, n.ImageStamp)
	}
	mac, _ := net.ParseMAC(n.MAC)
	started := time.Now()
	v, err := vm.Start(ctx, vm.Config{
		Name:         n.Name,
		Dir:          n.Dir,
		CPUs:         c.spec.CPUs,
		MemoryMiB:    c.spec.MemoryMiB,
		Accel:        c.accel,
		Image:        image,
		Firmware:     vm.DefaultFirmware(),
		Kernel:       c.spec.Kernel,
		Initrd:       c.spec.Initrd,
		Cmdline:      c.spec.Cmdline,
		StateDiskMiB: c.spec.StateDiskMiB,
		// A node started before (Start, Resume) continues its console.
		AppendSerialLog: !n.Started.IsZero(),
		Net:             &vm.NetConfig{Tap: n.Tap, MAC: mac},
		ExecPrefix:      append(c.network.ExecPrefix(), niceWrap(nice)...),
		TPMNice:         nice,
		ProvisionTPM: func(rw io.ReadWriter) error {
			_, err := c.ca.ProvisionAK(rw, platformca.NewInstance(n.Name))
			return err
		},
	})
	if err != nil {
		return fmt.Errorf("start VM %s: %w", n.Name, err)
	}
	c.mu.Lock()
	n.vm, n.PID, n.Spare, n.Started = v, v.PID(), false, started
	n.Image, n.ImageStamp = image, stamp
	c.mu.Unlock()
	return c.writeState()
}

// SpareOptions says how StartSpare boots a spare.
type SpareOptions struct {
	// Image is a disk image booted with UEFI like Spec.Image; empty means
	// Spec.Image.
	Image string
	// Nice, if not zero, runs the VM at this CPU niceness, so that on a
	// host with few cores a late node does not starve the running
	// cluster's control plane (under TCG a booting node takes a core).
	// Zero means the niceness of every worker (see defaultNice).
	Nice int
}

// StartSpare boots the next unstarted spare slot.
func (c *Cloud) StartSpare(ctx context.Context, opts SpareOptions) (*Node, error) {
	image := opts.Image
	if c.spec.Kernel != "" && image != "" {
		return nil, errors.New("cloud: this cloud boots a kernel directly; a spare cannot boot a disk image")
	}
	if image == "" {
		image = c.spec.Image
	}
	c.mu.Lock()
	i := slices.IndexFunc(c.nodes, func(n *Node) bool { return n.Spare })
	c.mu.Unlock()
	if i < 0 {
		return nil, fmt.Errorf("cloud: no spare slot left (Spec.Spares = %d)", c.spec.Spares)
	}
	n := c.nodes[i]
	nice := opts.Nice
	if nice == 0 {
		nice = c.defaultNice(n)
	}
	if nice < -20 || nice > 19 {
		return nil, fmt.Errorf("cloud: niceness %d out of range -20..19", nice)
	}

	if err := c.startVM(ctx, n, image, nice); err != nil {
		return nil, err
	}
	return n, nil
}

// MaxNodesPerRole bounds the control planes, and the workers, of a cloud:
// each role's addresses come from a range of its own (firstCP, firstWorker).
const MaxNodesPerRole = 50

func (s Spec) validate() error {
	switch {
	case s.Dir == "":
		return errors.New("cloud: no state directory given")
	case s.ControlPlanes < 1:
		return errors.New("cloud: at least one control-plane node is needed")
	case s.Workers < 0 || s.Spares < 0:
		return errors.New("cloud: negative number of workers or spares")
	case s.ControlPlanes > MaxNodesPerRole || s.Workers+s.Spares > MaxNodesPerRole:
		return fmt.Errorf("cloud: at most %d control planes and %d workers (spares included)", MaxNodesPerRole, MaxNodesPerRole)
	case s.Image == "" && s.Kernel == "":
		return errors.New("cloud: neither an image nor a kernel to boot")
	case s.Image != "" && s.Kernel != "":
		return errors.New("cloud: give an image or a kernel, not both")
	}
	return nil
}

// probeKernel is what the KVM probe boots: the test kernel, or the
// node's pinned kernel for image boots ("" if it is not fetched: the probe
// then says so).
func (s Spec) probeKernel() string {
	if s.Kernel != "" {
		return s.Kernel
	}
	k, _ := nodepackages.Kernel()
	return k.Path
}

func (c *Cloud) progress(format string, args ...any) {
	if c.spec.Progress == nil {
		return
	}
	fmt.Fprintf(c.spec.Progress, "[%5.1fs] %s\n", time.Since(c.started).Seconds(), fmt.Sprintf(format, args...))
}

func (c *Cloud) takeLock() error {
	f, err := os.OpenFile(filepath.Join(c.spec.Dir, LockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("a local cloud is already running from %s, or another 'orrery mini' command is at work on it: 'orrery mini status' shows it", c.spec.Dir)
	}
	if st, err := readState(c.spec.Dir); err == nil && st.live() {
		f.Close()
		return fmt.Errorf("%s lists VMs of an earlier run that are still running: 'orrery mini stop' stops them keeping their disks, 'orrery mini down' deletes them", filepath.Join(c.spec.Dir, StateFile))
	}
	c.lock = f
	return nil
}

func (c *Cloud) platformCA() (*platformca.CA, error) {
	if ca, err := platformca.Load(c.spec.Dir); err == nil {
		return ca, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("platform CA in %s: %w", c.spec.Dir, err)
	}
	ca, err := platformca.New("Orrery local cloud platform CA")
	if err != nil {
		return nil, err
	}
	return ca, ca.Save(c.spec.Dir)
}

// initSecret creates the init secret the owner will present to `orrery
// init`, and returns the bcrypt hash the metadata API publishes.
func (c *Cloud) initSecret() ([]byte, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, err
	}
	secret := []byte(base64.RawURLEncoding.EncodeToString(raw))
	if err := os.WriteFile(filepath.Join(c.spec.Dir, InitSecretFile), append(bytes.Clone(secret), '\n'), 0o600); err != nil {
		return nil, fmt.Errorf("write init secret: %w", err)
	}
	return bcrypt.GenerateFromPassword(secret, bcrypt.DefaultCost)
}

func (c *Cloud) planNodes() {
	add := func(r role.Role, prefix string, count int, first netip.Addr, roleByte byte, tapTag string, spare bool) {
		ip := first
		for i := 0; i < count; i++ {
			name := fmt.Sprintf("%s-%d", prefix, i)
			c.nodes = append(c.nodes, &Node{
				Name:  name,
				Role:  r,
				IP:    ip,
				MAC:   fmt.Sprintf("52:54:00:42:%02x:%02x", roleByte, i),
				Tap:   fmt.Sprintf("%s%s%d", tapPrefix(c.spec.Bridge), tapTag, i),
				Dir:   filepath.Join(c.spec.Dir, name),
				Spare: spare,
			})
			ip = ip.Next()
		}
	}
	add(role.ControlPlane, "cp", c.spec.ControlPlanes, firstCP, 1, "c", false)
	add(role.Worker, "worker", c.spec.Workers, firstWorker, 2, "w", false)
	// Spares sit in the workers' range, after them.
	firstSpare := firstWorker
	for range c.spec.Workers {
		firstSpare = firstSpare.Next()
	}
	add(role.Worker, "spare", c.spec.Spares, firstSpare, 3, "s", true)
}

func (c *Cloud) startServices(ctx context.Context, initSecretHash []byte) error {
	var leases []dhcpd.Lease
	var instances []metadata.Instance
	for _, n := range c.nodes {
		mac, _ := net.ParseMAC(n.MAC)
		leases = append(leases, dhcpd.Lease{MAC: mac, IP: n.IP, Hostname: n.Name})
		in := metadata.Instance{Name: n.Name, Role: n.Role, IP: n.IP}
		if c.spec.SEVSNP {
			in.TEE = metadata.TEESimulatedSEVSNP
		}
		instances = append(instances, in)
	}
	cfg := metadataserver.Config{Instances: instances, InitSecretHash: initSecretHash, Endpoint: netip.AddrPortFrom(LoadBalancerIP, clusternet.APIServerPort)}
	if c.spec.SEVSNP {
		cfg.SEVSNPReport = c.sevSNPReport
	}
	handler, err := metadataserver.NewHandler(cfg)
	if err != nil {
		return err
	}
	return c.network.Do(func() error {
		var err error
		c.dhcp, err = dhcpd.Start(dhcpd.Config{
			Interface: c.spec.Bridge,
			ServerIP:  Gateway.Addr(),
			Prefix:    Gateway.Masked(),
			Router:    Gateway.Addr(),
			// The local cloud resolves no names; the gateway stands in as
			// the upstream server so that CoreDNS starts (it refuses to
			// run without one) and serves the cluster's names.
			DNS:       []netip.Addr{Gateway.Addr()},
			LeaseTime: time.Hour,
			Leases:    leases,
			OnLease:   c.onLease,
		})
		if err != nil {
			return fmt.Errorf("start DHCP server: %w", err)
		}
		lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", netip.AddrPortFrom(MetadataIP, 80).String())
		if err != nil {
			return fmt.Errorf("start metadata API: %w", err)
		}
		c.meta = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = c.meta.Serve(lis) }() // ends when Down closes lis
		return nil
	})
}

func (c *Cloud) onLease(l dhcpd.Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leases[l.MAC.String()] {
		return
	}
	c.leases[l.MAC.String()] = true
	c.progress("dhcp: %s got %s", l.Hostname, l.IP)
	if len(c.leases) == c.spec.ControlPlanes+c.spec.Workers {
		close(c.leased)
	}
}

// WaitLeases waits until every VM Up started has received its DHCP lease.
func (c *Cloud) WaitLeases(ctx context.Context) error {
	select {
	case <-c.leased:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for DHCP leases: %w", ctx.Err())
	}
}

// Nodes lists the cloud's nodes, control planes first.
func (c *Cloud) Nodes() []*Node { return c.nodes }

// Accel is the accelerator the VMs run with and why it was chosen.
func (c *Cloud) Accel() (vm.Accel, string) { return c.accel, c.why }

// Network is the cloud's network, e.g. to run a command inside its
// namespace.
func (c *Cloud) Network() *netenv.Network { return c.network }

// Down stops every VM (gracefully within a short timeout, then by force),
// stops the services and removes the network and the VMs' files. It
// collects all errors and always does as much as it can.
func (c *Cloud) Down(ctx context.Context) error {
	errs := c.stopRunning(ctx)
	for _, n := range c.nodes {
		errs = append(errs, removeNodeDir(n.Dir, c.spec.KeepLogs))
	}
	errs = append(errs, removeNodeDir(filepath.Join(c.spec.Dir, LoadBalancerDir), c.spec.KeepLogs))
	errs = append(errs, removeRunFiles(c.spec.Dir))
	if c.lock != nil {
		c.lock.Close()
		errs = append(errs, removeIfExists(filepath.Join(c.spec.Dir, LockFile)))
	}
	c.progress("down")
	return errors.Join(errs...)
}

// stopRunning powers the VMs off (gracefully within the shutdown
// timeout, then by force), stops the services and removes the network;
// it touches no file.
func (c *Cloud) stopRunning(ctx context.Context) []error {
	var (
		errs []error
		mu   sync.Mutex
		wg   sync.WaitGroup
	)
	for _, n := range c.nodes {
		if n.vm == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.vm.PowerDown(ctx, c.spec.ShutdownTimeout); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("stop VM %s: %w", n.Name, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	c.mu.Lock()
	for _, n := range c.nodes {
		n.vm, n.PID = nil, 0
	}
	c.mu.Unlock()
	if c.meta != nil {
		_ = c.meta.Close()
		c.meta = nil
	}
	if c.lb != nil {
		c.lb.Stop()
		c.lb = nil
	}
	if c.dhcp != nil {
		_ = c.dhcp.Close()
		c.dhcp = nil
	}
	if c.network != nil {
		if err := c.network.Destroy(ctx); err != nil {
			errs = append(errs, err)
		}
		c.network = nil
	}
	return errs
}

func removeNodeDir(dir string, keepLogs bool) error {
	if !keepLogs {
		return os.RemoveAll(dir)
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if filepath.Ext(e.Name()) == ".log" {
			continue
		}
		errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
	}
	return errors.Join(errs...)
}

// removeRunFiles removes the files in dir that belong to one run of the
// cloud: its state file, and the init secret of VMs that are gone (the
// next Up makes a new one). The platform CA stays for the next run.
func removeRunFiles(dir string) error {
	return errors.Join(removeIfExists(filepath.Join(dir, StateFile)), removeIfExists(filepath.Join(dir, InitSecretFile)))
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Abandon stops the cloud's in-process services and releases its lock
// without stopping the VMs or removing anything, as a crash would. Tests
// use it to check that Cleanup finds the leftovers.
func (c *Cloud) Abandon() {
	if c.meta != nil {
		c.meta.Close()
	}
	if c.lb != nil {
		c.lb.Stop()
	}
	if c.dhcp != nil {
		c.dhcp.Close()
	}
	if c.lock != nil {
		c.lock.Close()
	}
}

// tapPrefix starts the names of a cloud's taps, so leftovers can be found
// by name.
func tapPrefix(bridge string) string { return bridge + "-" }
