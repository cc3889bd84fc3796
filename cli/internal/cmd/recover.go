package cmd

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/owner"
	"github.com/orrery-dev/orrery/internal/owner/dialer"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
	"github.com/orrery-dev/orrery/internal/proto/recoverpb"
	"github.com/orrery-dev/orrery/internal/role"
)

type recoverOptions struct {
	nodes            []string
	masterSecretPath string
	measurementsPath string
	hardware         hardwareOptions
	platformCAPath   string
	miniDir          string
	timeout          time.Duration
}

func newRecoverCmd() *cobra.Command {
	var o recoverOptions
	c := &cobra.Command{
		Use:   "recover [--node HOST[:PORT]]...",
		Short: "Give rebooted control planes their disk keys when no join service can",
		Long: fmt.Sprintf(`recover unlocks a control-plane node that rebooted while every other control
plane was down: its initrd found no join service to get its state disk's key
from, and waits, serving recovery on port %d (its console says so).

recover checks the node's attestation against the image's measurements
and that the node is the control plane your workspace records ('orrery
init' wrote its instance into the state file; the VM's platform certifies
it in the node's attestation key), then sends it the cluster's master
secret and the cluster's CA and API server from the admin kubeconfig
beside it, and waits until the node says it opened its disk. The node
keeps a control plane's files on your word alone, never on the cloud's
metadata. The node derives its key
itself; a master secret of another cluster is refused, and the node keeps
waiting, unchanged. Workers need no recovery: they rejoin by themselves once
a control plane is back.

With several control planes (the ones 'orrery control-plane approve'
recorded in the workspace, and the first), etcd serves only once a majority
of them runs, and until then no join service does: recover takes the nodes
in the order given (without --node, every control plane of 'orrery mini',
cp-0 first) and stops once a majority is back; the others then rejoin by
themselves through the join service. It says which it recovered.`, recoverpb.Port),
		Example: `  orrery recover                                 # the control planes of 'orrery mini'
  orrery recover --node 10.42.1.100              # one node
  orrery recover --node 10.0.0.5 --node 10.0.0.6 --master-secret orrery-master-secret.json \
    --measurements build/image/measurements.json --platform-ca platform-ca.crt`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.masterSecretPath == "" {
				o.masterSecretPath = workspaceDir(cmd).Path(workspace.MasterSecretFile)
			}
			return runRecover(cmd.Context(), cmd.OutOrStdout(), logger(cmd), o)
		},
	}
	f := c.Flags()
	f.StringArrayVar(&o.nodes, "node", nil, fmt.Sprintf("a waiting control plane, HOST or HOST:PORT (port defaults to %d); repeatable, in the order to recover them (default: the control planes of 'orrery mini')", recoverpb.Port))
	f.StringVar(&o.masterSecretPath, "master-secret", "", "the cluster's master secret, as 'orrery init' wrote it (default: "+workspace.MasterSecretFile+" in the workspace)")
	f.StringVar(&o.measurementsPath, "measurements", imageMeasurements, secretMeasurementsUsage)
	addHardwareFlags(f, &o.hardware)
	f.StringVar(&o.platformCAPath, "platform-ca", "", "CA certificate that certifies the nodes' attestation keys (default: the one of 'orrery mini')")
	f.StringVar(&o.miniDir, "mini-dir", "orrery-mini", "state directory of 'orrery mini'; supplies the default --platform-ca and --node")
	f.DurationVar(&o.timeout, "timeout", 10*time.Minute, "how long to wait for each node")
	return c
}

func runRecover(ctx context.Context, out io.Writer, log *slog.Logger, o recoverOptions) error {
	if o.timeout <= 0 {
		return fmt.Errorf("--timeout %s: want a positive duration such as 10m", o.timeout)
	}
	mini, miniErr := cloud.ReadState(o.miniDir)
	noMini := func(flag, what string) error {
		if errors.Is(miniErr, fs.ErrNotExist) {
			return errors.New("no " + flag + " given and no 'orrery mini' state in " + o.miniDir + ": pass " + flag)
		}
		return fmt.Errorf("no %s given, and the local cloud's %s not taken: %w", flag, what, miniErr)
	}
	if len(o.nodes) == 0 {
		if miniErr != nil {
			return noMini("--node", "control planes are")
		}
		for _, n := range mini.Nodes {
			if n.Role == role.ControlPlane {
				o.nodes = append(o.nodes, n.IP.String())
			}
		}
	}
	var addrs []string
	for _, n := range o.nodes {
		addr, err := dialer.ParseAddress(n, recoverpb.Port)
		if err != nil {
			return fmt.Errorf("--node: %w", err)
		}
		addrs = append(addrs, addr)
	}
	if o.platformCAPath == "" {
		if miniErr != nil {
			return noMini("--platform-ca", "CA is")
		}
		o.platformCAPath = filepath.Join(o.miniDir, cloud.PlatformCACert)
	}
	m, err := loadPolicy(o.measurementsPath, o.hardware)
	if err != nil {
		return fmt.Errorf("load measurements: %w", err)
	}
	ca, err := platformca.LoadCert(o.platformCAPath)
	if err != nil {
		return err
	}
	ms, err := keys.ReadMasterSecretFile(o.masterSecretPath)
	if err != nil {
		return fmt.Errorf("%w (pass --master-secret, or --workspace: the directory where 'orrery init' wrote it)", err)
	}
	ws := workspace.Dir(filepath.Dir(o.masterSecretPath))
	cp, caCert, endpoint, err := recordedControlPlane(ws)
	if err != nil {
		return err
	}
	st, err := ws.ReadState()
	if err != nil {
		return err
	}
	cfg := owner.RecoverConfig{
		Measurements: m, PlatformCA: ca, Collateral: o.hardware.collateral(), MasterSecret: ms,
		ControlPlane: cp, ControlPlaneIDs: st.ControlPlanes, CACert: caCert, Endpoint: endpoint, Logger: log,
	}
	return recoverInOrder(ctx, out, owner.Recover, cfg, addrs, st.ControlPlaneCount(), o.timeout)
}

// recoverInOrder recovers the nodes at addrs one after the other, and
// stops once a majority of the cluster's count control planes is back:
// etcd then serves, and so does the join service, through which the
// others rejoin by themselves. A node that cannot be recovered is
// reported, and the next is tried.
func recoverInOrder(ctx context.Context, out io.Writer, recoverNode func(context.Context, owner.RecoverConfig) error, cfg owner.RecoverConfig, addrs []string, count int, timeout time.Duration) error {
	need := count/2 + 1
	if len(addrs) > 1 {
		fmt.Fprintf(out, "Your workspace records %d control planes: etcd serves once %d of them run. Recovering in this order, until %d are back: %s\n", count, need, need, strings.Join(addrs, ", "))
	}
	var back []string
	var errs []error
	for i, addr := range addrs {
		if ctx.Err() != nil {
			break
		}
		start := time.Now()
		p := &progressPrinter{out: out, start: start}
		cfg.Node, cfg.Progress = addr, p.event
		nodeCtx, cancel := context.WithTimeout(ctx, timeout)
		err := recoverNode(nodeCtx, cfg)
		cancel()
		if err != nil {
			if len(addrs) == 1 {
				return err
			}
			fmt.Fprintf(out, "%s was not recovered: %v\n", addr, err)
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			continue
		}
		back = append(back, addr)
		if len(back) >= need && i < len(addrs)-1 {
			fmt.Fprintf(out, "%d of %d control planes are back (%s): etcd has its quorum. The others (%s) rejoin by themselves through the join service once it runs; recover one with --node if its console still says it waits.\n",
				len(back), count, strings.Join(back, ", "), strings.Join(addrs[i+1:], ", "))
			return nil
		}
	}
	if len(addrs) > 1 {
		fmt.Fprintf(out, "Recovered %d of the %d control planes named (%s).\n", len(back), len(addrs), strings.Join(back, ", "))
	}
	if len(back) < need && len(addrs) > 1 {
		return fmt.Errorf("only %d of %d control planes are back, and etcd needs %d: %w", len(back), count, need, errors.Join(errs...))
	}
	return nil
}

// recordedControlPlane reads, from the workspace 'orrery init' wrote, the
// control plane it initialised (the state file) and the cluster's CA and
// API server (the admin kubeconfig): recover gives the master secret and
// a control plane's role to that instance alone.
func recordedControlPlane(ws workspace.Dir) (attestation.Instance, []byte, string, error) {
	st, err := ws.ReadState()
	if err != nil {
		return attestation.Instance{}, nil, "", fmt.Errorf("read %s beside the master secret: %w", workspace.StateFile, err)
	}
	if st.FirstNode == nil || st.FirstNode.Name == "" || st.FirstNode.InstanceID == "" {
		return attestation.Instance{}, nil, "", fmt.Errorf("%s records no control plane instance (an 'orrery init' that did not finish, or an older one): recover cannot tell the control plane from another node", ws.Path(workspace.StateFile))
	}
	path := ws.Path(workspace.KubeconfigFile)
	if err := ws.CheckRegular(workspace.KubeconfigFile); err != nil {
		return attestation.Instance{}, nil, "", fmt.Errorf("the admin kubeconfig beside the master secret: %w", err)
	}
	kc, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return attestation.Instance{}, nil, "", fmt.Errorf("read the admin kubeconfig beside the master secret: %w", err)
	}
	ctx := kc.Contexts[kc.CurrentContext]
	if ctx == nil || kc.Clusters[ctx.Cluster] == nil {
		return attestation.Instance{}, nil, "", fmt.Errorf("%s has no current context with a cluster", path)
	}
	cl := kc.Clusters[ctx.Cluster]
	block, _ := pem.Decode(cl.CertificateAuthorityData)
	u, err := url.Parse(cl.Server)
	if block == nil || err != nil || u.Host == "" {
		return attestation.Instance{}, nil, "", fmt.Errorf("%s: its cluster has no PEM CA certificate or no https server URL", path)
	}
	if st.FirstNode.Removed {
		// Removed ('orrery node remove'): the approved control planes
		// alone may get the master secret.
		return attestation.Instance{}, block.Bytes, u.Host, nil
	}
	return attestation.Instance{Name: st.FirstNode.Name, ID: st.FirstNode.InstanceID}, block.Bytes, u.Host, nil
}
