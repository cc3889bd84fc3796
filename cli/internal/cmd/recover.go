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
)

type recoverOptions struct {
	node             string
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
		Use:   "recover --node HOST[:PORT]",
		Short: "Give a rebooted control plane its disk key when no join service can",
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
a control plane is back.`, recoverpb.Port),
		Example: `  orrery recover --node 10.42.1.100              # a node of 'orrery mini'
  orrery recover --node 10.0.0.5 --master-secret orrery-master-secret.json \
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
	f.StringVar(&o.node, "node", "", fmt.Sprintf("the waiting node, HOST or HOST:PORT (port defaults to %d)", recoverpb.Port))
	f.StringVar(&o.masterSecretPath, "master-secret", "", "the cluster's master secret, as 'orrery init' wrote it (default: "+workspace.MasterSecretFile+" in the workspace)")
	f.StringVar(&o.measurementsPath, "measurements", imageMeasurements, secretMeasurementsUsage)
	addHardwareFlags(f, &o.hardware)
	f.StringVar(&o.platformCAPath, "platform-ca", "", "CA certificate that certifies the nodes' attestation keys (default: the one of 'orrery mini')")
	f.StringVar(&o.miniDir, "mini-dir", "orrery-mini", "state directory of 'orrery mini'; supplies the default --platform-ca")
	f.DurationVar(&o.timeout, "timeout", 10*time.Minute, "how long to wait for the node")
	_ = c.MarkFlagRequired("node")
	return c
}

func runRecover(ctx context.Context, out io.Writer, log *slog.Logger, o recoverOptions) error {
	addr, err := dialer.ParseAddress(o.node, recoverpb.Port)
	if err != nil {
		return fmt.Errorf("--node: %w", err)
	}
	if o.timeout <= 0 {
		return fmt.Errorf("--timeout %s: want a positive duration such as 10m", o.timeout)
	}
	if o.platformCAPath == "" {
		if _, err := cloud.ReadState(o.miniDir); errors.Is(err, fs.ErrNotExist) {
			return errors.New("no --platform-ca given and no 'orrery mini' state in " + o.miniDir + ": pass --platform-ca")
		} else if err != nil {
			return fmt.Errorf("no --platform-ca given, and the local cloud's CA is not taken: %w", err)
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
	cp, caCert, endpoint, err := recordedControlPlane(workspace.Dir(filepath.Dir(o.masterSecretPath)))
	if err != nil {
		return err
	}
	start := time.Now()
	p := &progressPrinter{out: out, start: start}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	return owner.Recover(ctx, owner.RecoverConfig{
		Node: addr, Measurements: m, PlatformCA: ca, Collateral: o.hardware.collateral(), MasterSecret: ms,
		ControlPlane: cp, CACert: caCert, Endpoint: endpoint, Logger: log, Progress: p.event,
	})
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
	return attestation.Instance{Name: st.FirstNode.Name, ID: st.FirstNode.InstanceID}, block.Bytes, u.Host, nil
}
