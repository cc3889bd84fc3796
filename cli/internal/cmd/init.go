package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/clusternet"
	"github.com/orrery-dev/orrery/internal/clustersettings"
	"github.com/orrery-dev/orrery/internal/owner"
	"github.com/orrery-dev/orrery/internal/owner/dialer"
	"github.com/orrery-dev/orrery/internal/owner/toolout"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/role"
	"github.com/orrery-dev/orrery/internal/versions"
)

type initOptions struct {
	miniDir           string
	node              string
	measurementsPath  string
	hardware          hardwareOptions
	platformCAPath    string
	initSecretPath    string
	outDir            string
	workspace         workspace.Dir
	replaceWorkspace  bool
	mergeKubeconfig   bool
	kubernetesVersion string
	clusterName       string
	sans              []string
	serviceCIDR       string
	endpoint          string
	timeout           time.Duration
	verbose           bool
	skipServices      bool
}

func newInitCmd() *cobra.Command {
	var o initOptions
	c := &cobra.Command{
		Use:   "init",
		Short: "Initialise a cluster on a node that has attested itself",
		Long: `init connects to the first control-plane node over attested TLS, checks its
measurements, and sends it the cluster's master secret (generated and saved
to orrery-master-secret.json, mode 0600, unless that file exists) with the
cluster's settings. The node locks itself to the new cluster, re-keys its
state disk, runs kubeadm init and returns the admin kubeconfig, which init
writes to orrery-admin.conf.

Keep orrery-master-secret.json safe: it is the only way to recover the
cluster's disks.`,
		Example: `  # a cluster on 'orrery mini': node, platform CA and init secret come from ./orrery-mini
  orrery init --measurements build/image/measurements.json

  # an explicit node
  orrery init --node 10.42.1.100 --measurements build/image/measurements.json \
    --platform-ca orrery-mini/platform-ca.crt --init-secret-file orrery-mini/init-secret`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.workspace = workspaceDir(cmd)
			o.verbose = o.verbose || logger(cmd).Enabled(cmd.Context(), slog.LevelDebug)
			if o.outDir != "" {
				o.workspace = workspace.Dir(o.outDir)
			}
			return runInit(cmd.Context(), cmd.OutOrStdout(), logger(cmd), o)
		},
	}
	f := c.Flags()
	f.StringVar(&o.miniDir, "mini-dir", "orrery-mini", "state directory of 'orrery mini'; supplies defaults for --node, --platform-ca and --init-secret-file")
	f.StringVar(&o.node, "node", "", "first control-plane node, HOST or HOST:PORT (default: the first control plane of 'orrery mini')")
	f.StringVar(&o.measurementsPath, "measurements", imageMeasurements, secretMeasurementsUsage)
	addHardwareFlags(f, &o.hardware)
	f.StringVar(&o.platformCAPath, "platform-ca", "", "CA certificate that certifies the nodes' attestation keys")
	f.StringVar(&o.initSecretPath, "init-secret-file", "", "file holding the init secret created with the VM")
	f.StringVar(&o.outDir, "out-dir", "", "the workspace")
	_ = f.MarkDeprecated("out-dir", "use --workspace")
	f.BoolVar(&o.replaceWorkspace, "replace-workspace", false, "the workspace holds an earlier init's files (another cluster's, or one whose VMs are gone): move them into orrery-replaced-<UTC time>/ in the workspace and start a new cluster")
	f.BoolVar(&o.mergeKubeconfig, "merge-kubeconfig", false, "also add the cluster to your kubeconfig ($KUBECONFIG or ~/.kube/config) as context orrery-<cluster name>, and make it the current context")
	f.StringVar(&o.kubernetesVersion, "kubernetes-version", versions.Default, "Kubernetes version to install: one the image carries ("+strings.Join(versions.List(), ", ")+"), or a minor alone (such as "+versions.Minor(versions.Default)+") for its newest patch")
	f.StringVar(&o.clusterName, "cluster-name", "orrery", "cluster name (a DNS label)")
	f.StringSliceVar(&o.sans, "api-server-san", nil, "extra name or IP for the API server certificate (repeatable)")
	f.StringVar(&o.serviceCIDR, "service-cidr", clusternet.DefaultServiceCIDR, "IP range of Kubernetes services")
	f.StringVar(&o.endpoint, "endpoint", "", fmt.Sprintf("the control planes' stable address, HOST or HOST:PORT (port %d if not given): a TCP load balancer in front of every control plane's API server and join service (port %d). "+
		"It is in every kubeconfig, join ticket and the API server's certificate, and cannot change later "+
		"(default: the local cloud's load balancer with 'orrery mini'; otherwise the node's own address, through which alone the cluster is then reached)", clusternet.APIServerPort, joinpb.Port))
	f.DurationVar(&o.timeout, "timeout", 30*time.Minute, "how long to wait for the node and for kubeadm")
	f.BoolVar(&o.verbose, "verbose", false, "show kubeadm's output")
	_ = f.MarkDeprecated("verbose", "use --log-level debug, which shows kubeadm's output")
	f.BoolVar(&o.skipServices, "skip-services", false, "do not install the cluster services (tests of the init protocol)")
	_ = f.MarkHidden("skip-services")
	return c
}

// applyMiniDefaults fills in what the flags left out from the local
// cloud's state, and returns that state, or nil if there is none.
func (o *initOptions) applyMiniDefaults() (*cloud.State, error) {
	st, err := cloud.ReadState(o.miniDir)
	if errors.Is(err, fs.ErrNotExist) {
		if o.node == "" {
			return nil, errors.New("no --node given and no 'orrery mini' state in " + o.miniDir + ": pass --node, or start the local cloud with 'orrery mini up'")
		}
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if o.node == "" {
		for _, n := range st.Nodes {
			if n.Role == role.ControlPlane {
				o.node = n.IP.String()
				break
			}
		}
	}
	if o.platformCAPath == "" {
		o.platformCAPath = filepath.Join(o.miniDir, cloud.PlatformCACert)
	}
	if o.initSecretPath == "" {
		o.initSecretPath = filepath.Join(o.miniDir, cloud.InitSecretFile)
	}
	if o.endpoint == "" && st.Endpoint.IsValid() {
		o.endpoint = st.Endpoint.String()
	}
	return &st, nil
}

func runInit(ctx context.Context, out io.Writer, log *slog.Logger, o initOptions) error {
	cfg, err := o.config()
	if err != nil {
		return err
	}
	start := time.Now()
	p := &progressPrinter{out: out, start: start, verbose: o.verbose}
	cfg.Progress = p.event
	cfg.Logger = log
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	res, err := owner.Init(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "Time per step:")
	toolout.WriteSteps(out, p.steps.Steps(time.Now()))
	fmt.Fprintf(out, "Done in %s. Kubeconfig: %s\n", time.Since(start).Round(time.Second), res.Kubeconfig)
	if o.mergeKubeconfig {
		name, path, err := mergeKubeconfig(res.Kubeconfig, "orrery-"+o.clusterName)
		if err != nil {
			return fmt.Errorf("the cluster runs, but adding it to your kubeconfig failed: %w (use --kubeconfig %s)", err, res.Kubeconfig)
		}
		fmt.Fprintf(out, "Added the context %s to %s and made it the current one: kubectl get nodes\n", name, path)
	}
	return nil
}

// settings are the cluster's settings the flags chose.
func (o initOptions) settings() clustersettings.Settings {
	return clustersettings.Settings{KubernetesVersion: o.kubernetesVersion, ClusterName: o.clusterName, APIServerSANs: o.sans, ServiceCIDR: o.serviceCIDR, ControlPlaneEndpoint: withAPIPort(o.endpoint)}
}

// withAPIPort adds the API server's port to an endpoint given as a host
// alone.
func withAPIPort(endpoint string) string {
	if endpoint == "" {
		return ""
	}
	if _, _, err := net.SplitHostPort(endpoint); err == nil {
		return endpoint
	}
	return net.JoinHostPort(strings.Trim(endpoint, "[]"), strconv.Itoa(clusternet.APIServerPort))
}

// checkFlags checks what the flags say on their own, so that a typo is
// reported before any file is read or any node dialled.
func (o initOptions) checkFlags() error {
	var errs []error
	if err := o.settings().Validate(versions.Supported); err != nil {
		errs = append(errs, err)
	}
	if o.timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout %s: want a positive duration such as 30m", o.timeout))
	}
	if o.node != "" {
		if _, err := dialer.ParseAddress(o.node, initpb.Port); err != nil {
			errs = append(errs, fmt.Errorf("--node: %w", err))
		}
	}
	return errors.Join(errs...)
}

// checkNetworks refuses a service range that holds the node's address or
// overlaps the local cloud's network: the node's own traffic would be
// routed to services.
func checkNetworks(serviceCIDR, addr string, mini *cloud.State) error {
	services := netip.MustParsePrefix(serviceCIDR)
	if ap, err := netip.ParseAddrPort(addr); err == nil && services.Contains(ap.Addr().Unmap()) {
		return fmt.Errorf("--service-cidr %s holds the node's address %s: choose a range the nodes' network does not use", services, ap.Addr())
	}
	if mini != nil && services.Overlaps(cloud.Gateway.Masked()) {
		return fmt.Errorf("--service-cidr %s overlaps the local cloud's network %s: choose another range", services, cloud.Gateway.Masked())
	}
	return nil
}

// config reads the files the flags name into the library's config.
func (o initOptions) config() (owner.InitConfig, error) {
	// A minor alone names the newest patch of it the image carries.
	if v, err := versions.Resolve(o.kubernetesVersion); err == nil {
		o.kubernetesVersion = v
	}
	if err := o.checkFlags(); err != nil {
		return owner.InitConfig{}, err
	}
	mini, err := o.applyMiniDefaults()
	if err != nil {
		return owner.InitConfig{}, err
	}
	addr, err := dialer.ParseAddress(o.node, initpb.Port)
	if err != nil {
		return owner.InitConfig{}, fmt.Errorf("--node: %w", err)
	}
	if err := checkNetworks(o.serviceCIDR, addr, mini); err != nil {
		return owner.InitConfig{}, err
	}
	if o.platformCAPath == "" {
		return owner.InitConfig{}, errors.New("no --platform-ca given: pass the CA that certifies the nodes' attestation keys")
	}
	if o.initSecretPath == "" {
		return owner.InitConfig{}, errors.New("no --init-secret-file given: pass the file with the init secret created with the VM")
	}
	m, err := loadPolicy(o.measurementsPath, o.hardware)
	if err != nil {
		return owner.InitConfig{}, fmt.Errorf("load measurements: %w (build the image with 'make image')", err)
	}
	ca, err := platformca.LoadCert(o.platformCAPath)
	if err != nil {
		return owner.InitConfig{}, err
	}
	initSecret, err := os.ReadFile(o.initSecretPath)
	if err != nil {
		return owner.InitConfig{}, fmt.Errorf("read init secret: %w", err)
	}
	return owner.InitConfig{
		Node:              addr,
		Measurements:      m,
		PlatformCA:        ca,
		Collateral:        o.hardware.collateral(),
		InitSecret:        []byte(strings.TrimSpace(string(initSecret))),
		Workspace:         o.workspace,
		ReplaceWorkspace:  o.replaceWorkspace,
		KubernetesVersion: o.kubernetesVersion,
		ClusterName:       o.clusterName,
		APIServerSANs:     o.sans,
		ServiceCIDR:       o.serviceCIDR,
		Endpoint:          withAPIPort(o.endpoint),
		SkipServices:      o.skipServices,
	}, nil
}
