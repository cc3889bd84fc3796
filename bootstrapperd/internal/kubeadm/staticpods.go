package kubeadm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/orrery-dev/orrery/internal/atomicfile"
	"github.com/orrery-dev/orrery/internal/clustersettings"
	"github.com/orrery-dev/orrery/internal/nodename"
	"github.com/orrery-dev/orrery/internal/strictjson"
)

// StaticPods are the control plane's static pods, as kubeadm names their
// manifests (NAME.yaml) and their one container.
var StaticPods = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// ErrKeptSettings means the kept manifests do not say which settings
// their control plane was made with: they were changed, or are not
// kubeadm's.
var ErrKeptSettings = errors.New("the control plane's kept static pods do not say what they were made with")

// KeptSettings reads, from the static pods kept in dir, the settings that
// made them: the node's name (from etcd's pod, when there is one) and
// address, the cluster's name, service range and Kubernetes version, and
// which CA signs kubelets' serving certificates.
// Everything else in a control plane's static pods is Orrery's kubeadm
// configuration, which the root carries.
//
// The settings come from the state disk, which root on the control plane
// may have written; the caller holds them to what an owner may ask of an
// init (clustersettings), so a changed one can break this control plane
// but can add no flag, mount or image to it.
func KeptSettings(dir string) (InitParams, error) {
	pods := map[string]podSpec{}
	for _, name := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		p, err := readPod(filepath.Join(dir, name+".yaml"), name)
		if name == "etcd" && errors.Is(err, fs.ErrNotExist) {
			continue // a control plane's kubeadm join writes it last
		}
		if err != nil {
			return InitParams{}, err
		}
		pods[name] = p
	}
	var p InitParams
	var errs []error
	want := func(pod, flag string) string {
		v, ok := pods[pod].flag(flag)
		if !ok {
			errs = append(errs, fmt.Errorf("%s.yaml gives no single --%s", pod, flag))
		}
		return v
	}
	if _, ok := pods["etcd"]; ok {
		p.NodeName = want("etcd", "name")
	}
	ip := want("kube-apiserver", "advertise-address")
	p.ServiceCIDR = want("kube-apiserver", "service-cluster-ip-range")
	p.ClusterName = want("kube-controller-manager", "cluster-name")
	if len(errs) > 0 {
		return InitParams{}, fmt.Errorf("%w: %w", ErrKeptSettings, errors.Join(errs...))
	}
	if _, ok := pods["etcd"]; ok && !nodename.Valid(p.NodeName) {
		return InitParams{}, fmt.Errorf("%w: etcd.yaml names the node %s, which is not a node name", ErrKeptSettings, clustersettings.Quote(p.NodeName))
	}
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return InitParams{}, fmt.Errorf("%w: kube-apiserver.yaml advertises %s, which is not an IP address", ErrKeptSettings, clustersettings.Quote(ip))
	}
	p.NodeIP = addr
	const image = "registry.k8s.io/kube-apiserver:"
	ref := pods["kube-apiserver"].Containers[0].Image
	if !strings.HasPrefix(ref, image) {
		return InitParams{}, fmt.Errorf("%w: kube-apiserver.yaml runs image %s, not %sVERSION", ErrKeptSettings, clustersettings.Quote(ref), image)
	}
	p.KubernetesVersion = strings.TrimPrefix(ref, image)
	switch ca := want("kube-apiserver", "kubelet-certificate-authority"); ca {
	case kubeletServingCA.Value:
		p.KubeletServingCA = true
	case kubeletClusterCA.Value:
	default:
		return InitParams{}, fmt.Errorf("%w: kube-apiserver.yaml checks kubelets against %s, neither %s nor %s", ErrKeptSettings, clustersettings.Quote(ca), kubeletServingCA.Value, kubeletClusterCA.Value)
	}
	if len(errs) > 0 {
		return InitParams{}, fmt.Errorf("%w: %w", ErrKeptSettings, errors.Join(errs...))
	}
	return p, nil
}

// podSpec is what KeptSettings reads of a static pod.
type podSpec struct {
	Containers []struct {
		Name    string   `json:"name"`
		Image   string   `json:"image"`
		Command []string `json:"command"`
	} `json:"containers"`
}

func readPod(path, component string) (podSpec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return podSpec{}, fmt.Errorf("%w: %w", ErrKeptSettings, err)
	}
	var pod struct {
		Spec podSpec `json:"spec"`
	}
	// As kubelet reads it: names match exactly, so the settings read here
	// are the ones the kept pod ran with.
	if err := strictjson.KubernetesYAML(b, &pod); err != nil {
		return podSpec{}, fmt.Errorf("%w: %s is not a pod: %w", ErrKeptSettings, filepath.Base(path), err)
	}
	if len(pod.Spec.Containers) != 1 || pod.Spec.Containers[0].Name != component {
		return podSpec{}, fmt.Errorf("%w: %s does not run one container %s", ErrKeptSettings, filepath.Base(path), component)
	}
	return pod.Spec, nil
}

// flag returns the value of --name=VALUE in the container's command, if
// it is given exactly once.
func (p podSpec) flag(name string) (string, bool) {
	var values []string
	for _, a := range p.Containers[0].Command {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			values = append(values, v)
		}
	}
	if len(values) != 1 {
		return "", false
	}
	return values[0], true
}

// StaticPods returns the control plane's static pods (manifest name to
// contents) as kubeadm writes them from p and Orrery's configuration:
// kubeadm's init phases for the control plane and its local etcd, run
// dry, so they write into a directory of the tool's and touch nothing
// else. A control plane that joined another gets its etcd's first-boot
// flags (--initial-cluster) as a first control plane's; etcd reads them
// only while its data directory is empty.
func (t *Tool) StaticPods(ctx context.Context, p InitParams, out io.Writer) (map[string][]byte, error) {
	if p.NodeName == "" {
		// Only etcd's pod names the node, and there is none to write.
		p.NodeName = "unnamed"
	}
	// Not init's directory: this may run while kubeadm init does (its
	// kubelet start), and init's holds a patch for a later phase.
	p.PatchDir = filepath.Join(t.ConfigDir, "static-pod-patches")
	if err := writePatches(p.PatchDir, nil); err != nil {
		return nil, err
	}
	cfg, err := InitConfig(p)
	if err != nil {
		return nil, err
	}
	path, err := t.writeConfig("kubeadm-static-pods.yaml", cfg)
	if err != nil {
		return nil, err
	}
	defer os.Remove(path)
	dir, err := os.MkdirTemp(t.ConfigDir, "static-pods-")
	if err != nil {
		return nil, fmt.Errorf("make a directory for kubeadm's static pods: %w", err)
	}
	defer os.RemoveAll(dir)
	// kubeadm writes a dry run's files where this variable says; the
	// program env passes it to kubeadm alone.
	env := "KUBEADM_INIT_DRYRUN_DIR=" + dir
	for _, phase := range []string{"control-plane all", "etcd local"} {
		args := append([]string{env, "kubeadm", "init", "phase"}, strings.Fields(phase)...)
		args = append(args, "--config", path, "--dry-run")
		if err := t.Runner.Run(ctx, "env", args, nil, out); err != nil {
			return nil, fmt.Errorf("kubeadm init phase %s: %w", phase, err)
		}
	}
	pods := map[string][]byte{}
	for _, name := range StaticPods {
		b, err := os.ReadFile(filepath.Join(dir, name+".yaml"))
		if err != nil {
			return nil, fmt.Errorf("kubeadm wrote no static pod %s: %w", name, err)
		}
		pods[name] = b
	}
	return pods, nil
}

// RewriteStaticPods makes the static pods in dir what want holds: each
// one that differs is written anew, and its name returned. A missing one
// stays missing: it runs nothing, and a control plane's kubeadm join
// starts kubelet (and so this) before it writes etcd's.
func RewriteStaticPods(dir string, want map[string][]byte) ([]string, error) {
	var rewrote []string
	for _, name := range slices.Sorted(maps.Keys(want)) {
		path := filepath.Join(dir, name+".yaml")
		have, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return rewrote, fmt.Errorf("read %s: %w", path, err)
		}
		if bytes.Equal(have, want[name]) {
			continue
		}
		if err := atomicfile.WriteFile(path, want[name], 0o600); err != nil {
			return rewrote, fmt.Errorf("write %s: %w", path, err)
		}
		rewrote = append(rewrote, name)
	}
	return rewrote, nil
}
