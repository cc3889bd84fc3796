package kubeadm

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/records/controlplanes"
)

// Names of what init stores in the cluster for the join and key services.
const (
	Namespace          = "kube-system"
	MasterSecretName   = "orrery-master-secret" //nolint:gosec // the Secret's name, not a secret
	MasterSecretKey    = "master-secret.json"
	JoinConfigName     = "orrery-join-config"
	MeasurementSaltKey = "measurementSalt"
	// ControlPlanesKey lists the instance IDs the owner approved as
	// control planes; the join service hands the cluster's CA keys to
	// those only (see internal/records/controlplanes).
	ControlPlanesKey = controlplanes.Key
)

// Runner runs a tool: the one seam to kubeadm and kubectl.
type Runner interface {
	Run(ctx context.Context, name string, args []string, stdin io.Reader, out io.Writer) error
}

// ExecRunner runs tools with os/exec.
type ExecRunner struct{}

// Run implements Runner.
func (ExecRunner) Run(ctx context.Context, name string, args []string, stdin io.Reader, out io.Writer) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", name, args[0], err)
	}
	return nil
}

// Tool runs kubeadm and kubectl on this node.
type Tool struct {
	Runner Runner
	// ConfigDir receives kubeadm's configuration files (a tmpfs: a join's
	// discovery kubeconfig holds the node's client key).
	ConfigDir string
	// AdminKubeconfig is where kubeadm init writes the admin kubeconfig.
	AdminKubeconfig string
	// PKIDir is kubeadm's certificate directory ("": CertificatesDir).
	PKIDir string
	// Instance is this node's VM as its platform certified it (see
	// qemu.ReadInstance). StoreMasterSecret writes its ID as the first
	// approved control plane: the one the owner initialised. The zero
	// Instance (a VM provisioned before instances were certified)
	// approves none.
	Instance attestation.Instance
}

// Init runs kubeadm init and returns the admin kubeconfig.
func (t *Tool) Init(ctx context.Context, p InitParams, out io.Writer) ([]byte, error) {
	p.PatchDir = filepath.Join(t.ConfigDir, "kubeadm-patches")
	p.KubeletServingCA = true
	cfg, err := InitConfig(p)
	if err != nil {
		return nil, err
	}
	patch, err := coreDNSPatch(p.endpoint())
	if err != nil {
		return nil, err
	}
	if err := writePatches(p.PatchDir, map[string]string{coreDNSPatchFile: patch}); err != nil {
		return nil, err
	}
	path, err := t.writeConfig("kubeadm-init.yaml", cfg)
	if err != nil {
		return nil, err
	}
	// The controller manager and API server that kubeadm starts name
	// the kubelet-serving CA; kubeadm makes the other CAs itself.
	if err := EnsureKubeletServingCA(t.pkiDir(), time.Now()); err != nil {
		return nil, err
	}
	// The token kubeadm would print is useless here: nodes join with the
	// client certificate the join service signs for them.
	if err := t.Runner.Run(ctx, "kubeadm", []string{"init", "--config", path, "--skip-token-print"}, nil, out); err != nil {
		return nil, err
	}
	kubeconfig, err := os.ReadFile(t.AdminKubeconfig)
	if err != nil {
		return nil, fmt.Errorf("read the admin kubeconfig kubeadm wrote: %w", err)
	}
	return kubeconfig, nil
}

func (t *Tool) pkiDir() string {
	if t.PKIDir != "" {
		return t.PKIDir
	}
	return CertificatesDir
}

// Join runs kubeadm join.
func (t *Tool) Join(ctx context.Context, p JoinParams, out io.Writer) error {
	p.PatchDir = filepath.Join(t.ConfigDir, "kubeadm-patches")
	patches := workerKubeletPatch
	if p.ControlPlane {
		patches = patchFiles
	}
	if err := writePatchFiles(p.PatchDir, patches); err != nil {
		return err
	}
	discovery, err := DiscoveryKubeconfig(p)
	if err != nil {
		return err
	}
	discoveryPath, err := t.writeConfig("kubeadm-discovery.conf", discovery)
	if err != nil {
		return err
	}
	defer os.Remove(discoveryPath)
	cfg, err := JoinConfig(p, discoveryPath)
	if err != nil {
		return err
	}
	path, err := t.writeConfig("kubeadm-join.yaml", cfg)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	return t.Runner.Run(ctx, "kubeadm", []string{"join", "--config", path}, nil, out)
}

// Reset undoes a failed kubeadm join (files in /etc/kubernetes, the
// kubelet's state, containers it started) so a retry passes the preflight.
func (t *Tool) Reset(ctx context.Context, out io.Writer) error {
	return t.Runner.Run(ctx, "kubeadm", []string{"reset", "--force"}, nil, out)
}

func (t *Tool) writeConfig(name string, data []byte) (string, error) {
	if err := os.MkdirAll(t.ConfigDir, 0o700); err != nil {
		return "", err
	}
	path := filepath.Join(t.ConfigDir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return "", fmt.Errorf("write kubeadm configuration: %w", err)
	}
	return path, nil
}

// StoreMasterSecret stores the master secret as a Secret only the key
// service mounts, and the measurement salt (not a secret) in a ConfigMap
// for the join service. The manifest goes to kubectl on stdin, so the
// secret never lands in a file.
func (t *Tool) StoreMasterSecret(ctx context.Context, ms keys.MasterSecret, measurementSalt []byte) error {
	manifest, err := secretManifests(ms, measurementSalt, t.Instance)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	// --validate=false: client-side validation first downloads and parses
	// the API server's OpenAPI document, seconds of CPU under TCG on the
	// init's critical path, to check a manifest this package generates.
	// The API server still checks the objects against their schema.
	err = t.Runner.Run(ctx, "kubectl", []string{"--kubeconfig", t.AdminKubeconfig, "apply", "--server-side", "--validate=false", "-f", "-"},
		bytes.NewReader(manifest), &out)
	if err != nil {
		// kubectl's output names objects, never their data.
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}

func secretManifests(ms keys.MasterSecret, salt []byte, self attestation.Instance) ([]byte, error) {
	file, err := json.Marshal(ms)
	if err != nil {
		return nil, err
	}
	secret := map[string]any{
		"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
		"metadata": map[string]any{"name": MasterSecretName, "namespace": Namespace},
		"data":     map[string]string{MasterSecretKey: base64.StdEncoding.EncodeToString(file)},
	}
	data := map[string]string{MeasurementSaltKey: base64.StdEncoding.EncodeToString(salt)}
	if !self.IsZero() {
		// The ID alone: an owner appends to this list, and a comment
		// here would swallow an ID appended to its line.
		data[ControlPlanesKey] = self.ID + "\n"
	}
	cm := map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": JoinConfigName, "namespace": Namespace},
		"data":     data,
	}
	return documents(secret, cm)
}
