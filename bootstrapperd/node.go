package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/initserver"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/statedisk"
	"github.com/orrery-dev/orrery/internal/cloud/metadata"
	"github.com/orrery-dev/orrery/internal/cryptsetup"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/measurelog"
	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
	"github.com/orrery-dev/orrery/internal/versions"
)

// Node paths.
const (
	metadataURL = "http://169.254.169.254"
	stateDir    = "/var/lib/orrery"
	runDir      = "/run/orrery"
)

// registerNodeServices adds the init service, wired to this node's TPM,
// state disk, metadata service and kubeadm. done is called once the node
// is bootstrapped.
func registerNodeServices(cfg config, srv *grpc.Server, done func()) {
	meta := &metadata.Client{BaseURL: metadataURL}
	tool := &kubeadm.Tool{Runner: kubeadm.ExecRunner{}, ConfigDir: runDir, AdminKubeconfig: "/etc/kubernetes/admin.conf"}
	init := initserver.New(initserver.Config{
		Lock:           nodelock.New(cfg.openTPM, &measurelog.Log{Path: cfg.measurementLog}),
		Disk:           &statedisk.Disk{LUKS: &cryptsetup.Tool{}, Sysfs: "/sys", FirstBootKey: statedisk.DefaultFirstBootKey, TmpDir: runDir},
		Cluster:        &cluster{tool: tool, meta: meta},
		InitSecretHash: meta.InitSecretHash,
		Supported: func(v string) error {
			_, err := versions.Get(v)
			return err
		},
		Journal:    journal,
		ResultPath: filepath.Join(stateDir, "init-result.json"),
		Bootstrapped: func() {
			if err := markBootstrapped(cfg.bootstrappedMarker); err != nil {
				fmt.Fprintf(os.Stderr, "bootstrapperd: %v\n", err)
			}
			done()
		},
		Logger: slogTo(os.Stderr),
	})
	initpb.RegisterInitServiceServer(srv, init)
}

// cluster runs kubeadm for the init server with this node's name and
// address from the metadata service.
type cluster struct {
	tool *kubeadm.Tool
	meta *metadata.Client
}

func (c *cluster) Init(ctx context.Context, p initserver.ClusterParams, out io.Writer) ([]byte, error) {
	self, err := c.meta.Self(ctx)
	if err != nil {
		return nil, fmt.Errorf("ask the metadata service who this node is: %w", err)
	}
	// kubeadm finds its images only once they are imported into containerd.
	if err := c.tool.Runner.Run(ctx, "systemctl", []string{"start", "orrery-images.service"}, nil, out); err != nil {
		return nil, fmt.Errorf("import the baked container images: %w", err)
	}
	return c.tool.Init(ctx, kubeadm.InitParams{
		NodeName:          self.Name,
		NodeIP:            self.IP,
		KubernetesVersion: p.KubernetesVersion,
		ClusterName:       p.ClusterName,
		ServiceCIDR:       p.ServiceCIDR,
		CertSANs:          p.APIServerSANs,
	}, out)
}

func (c *cluster) StoreMasterSecret(ctx context.Context, ms keys.MasterSecret, salt []byte) error {
	return c.tool.StoreMasterSecret(ctx, ms, salt)
}

// journal returns this boot's journal, newest entries last, bounded so a
// failure report fits in one gRPC message.
func journal(ctx context.Context) ([]byte, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "journalctl", "--boot", "--no-pager", "--lines", "3000")
	cmd.Stdout = &out
	err := cmd.Run()
	b := out.Bytes()
	if len(b) > 3<<20 {
		b = b[len(b)-3<<20:]
	}
	return b, err
}

func markBootstrapped(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, nil, 0o644)
}
