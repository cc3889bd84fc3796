// Package services installs the cluster services Orrery runs in a new
// cluster (the pod network, the join and key services) as Helm releases,
// and waits until the control plane is healthy and stays so.
package services

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sync/errgroup"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/cli"
	"helm.sh/helm/v3/pkg/storage/driver"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/orrery-dev/orrery/internal/buildinfo"
	"github.com/orrery-dev/orrery/internal/owner/charts"
	"github.com/orrery-dev/orrery/internal/owner/clusterhealth"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
	"github.com/orrery-dev/orrery/internal/records/removednodes"
)

// Namespace holds Orrery's cluster services and their releases.
const Namespace = "kube-system"

// ReleaseRef names a Helm release Orrery owns: it installs it at init and
// upgrades it; nothing else should change it but 'helm rollback'.
type ReleaseRef struct {
	Name, Namespace string
	// Chart is the embedded chart's name (package charts).
	Chart string
	// Needs names the releases that must be in place before this one is
	// installed or upgraded.
	Needs []string
}

// Owned are Orrery's releases, in the order an upgrade takes them: the
// definitions of Orrery's resources before the release that has objects
// of them, the pod network before the services whose pods need it.
var Owned = []ReleaseRef{
	{Name: "orrery-crds", Namespace: Namespace, Chart: charts.OrreryCRDs},
	{Name: "flannel", Namespace: Namespace, Chart: charts.Flannel},
	{Name: "orrery-services", Namespace: Namespace, Chart: charts.OrreryServices, Needs: []string{"orrery-crds"}},
}

// Owner is the release of Owned called name.
func Owner(name string) (ReleaseRef, bool) {
	for _, r := range Owned {
		if r.Name == name {
			return r, true
		}
	}
	return ReleaseRef{}, false
}

// Release is one chart installed into the cluster.
type Release struct {
	ReleaseRef
	Values map[string]any
}

// Settings are what the releases need to know about the cluster.
type Settings struct {
	// APIServer is the control plane's API server, HOST:PORT.
	APIServer string
	// PodCIDR is the pod network; kubeadm's podSubnet on the nodes
	// must be the same.
	PodCIDR string
	// MeasurementSets are the images whose nodes may join.
	MeasurementSets []measurementset.Set
	// PlatformCA is the PEM certificate of the CA that certifies nodes'
	// attestation keys.
	PlatformCA []byte
}

// Releases returns the releases of a cluster with settings s.
func Releases(s Settings) ([]Release, error) {
	host, port, err := net.SplitHostPort(s.APIServer)
	if err != nil {
		return nil, fmt.Errorf("API server address %q: %w", s.APIServer, err)
	}
	if len(s.MeasurementSets) == 0 {
		return nil, errors.New("no measurement set: the join service would admit no node")
	}
	var sets []any
	for _, m := range s.MeasurementSets {
		v, err := m.Values()
		if err != nil {
			return nil, fmt.Errorf("measurement set %s: %w", m.Name, err)
		}
		sets = append(sets, v)
	}
	values := map[string]map[string]any{
		charts.OrreryCRDs: {},
		charts.Flannel: {
			"podCIDR":   s.PodCIDR,
			"apiServer": map[string]any{"host": host, "port": port},
		},
		charts.OrreryServices: {
			"endpoint":        s.APIServer,
			"apiServerPort":   port,
			"measurementSets": sets,
			"platformCA":      string(s.PlatformCA),
		},
	}
	var out []Release
	for _, ref := range Owned {
		out = append(out, Release{ReleaseRef: ref, Values: values[ref.Chart]})
	}
	return out, nil
}

// Install installs or upgrades releases with Helm and waits until they
// run; progress gets a message as each starts and ends, from the
// release's own goroutine (calls can overlap). Installing again
// (a retried init) upgrades in place. Releases install side by side,
// each once those it Needs are in: on a slow machine most of each
// install is waiting for its pods, and the pod network and the join
// service (on the host network) do not wait for each other.
func Install(ctx context.Context, kubeconfig string, releases []Release, timeout time.Duration, progress func(msg string)) error {
	client, err := clientFor(kubeconfig)
	if err != nil {
		return err
	}
	// A control plane rebooted since the last 'orrery init' drops
	// connections until its API server is up again.
	waitCtx, cancel := context.WithTimeout(ctx, timeout)
	err = clusterhealth.WaitAPIServer(waitCtx, clusterhealth.Config{Client: client, Progress: progress})
	cancel()
	if err != nil {
		return err
	}
	if err := EnsureRemovedNodesList(ctx, client); err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	done := map[string]chan struct{}{}
	for _, r := range releases {
		done[r.Name] = make(chan struct{})
	}
	for _, r := range releases {
		g.Go(func() error {
			for _, need := range r.Needs {
				ch, ok := done[need]
				if !ok {
					return fmt.Errorf("release %s needs %s, which is not installed with it", r.Name, need)
				}
				select {
				case <-ch:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			start := time.Now()
			c, err := charts.Load(r.Chart)
			if err != nil {
				return err
			}
			// One Helm configuration per release: its client and
			// release storage are not meant to be shared between
			// goroutines.
			cfg, err := HelmConfig(kubeconfig, r.Namespace)
			if err != nil {
				return err
			}
			progress(fmt.Sprintf("installing %s (chart %s %s)", r.Name, c.Metadata.Name, c.Metadata.Version))
			if err := installOrUpgrade(ctx, cfg, r.Name, c, r.Values, timeout); err != nil {
				return fmt.Errorf("install %s: %w", r.Name, err)
			}
			progress(fmt.Sprintf("%s runs (%s)", r.Name, time.Since(start).Round(time.Second)))
			close(done[r.Name])
			return nil
		})
	}
	return g.Wait()
}

// EnsureRemovedNodesList creates the cluster's list of removed nodes,
// empty, unless it exists: the orrery-services chart's admission policy
// reads it on every write in the cluster, and must find it in the API
// server's cache (removednodes.ConfigMap says why). It is not the chart's
// object: Helm would take back the names 'orrery node remove' lists, and
// could not adopt a list made before the chart had one.
func EnsureRemovedNodesList(ctx context.Context, client kubernetes.Interface) error {
	_, err := client.CoreV1().ConfigMaps(removednodes.Namespace).Create(ctx, removednodes.ConfigMap(nil), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create the removed-node list %s/%s: %w", removednodes.Namespace, removednodes.ConfigMapName, err)
	}
	return nil
}

func clientFor(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("read kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("connect to the cluster: %w", err)
	}
	return client, nil
}

// HelmConfig connects Helm to the cluster of kubeconfig, for releases in
// namespace, with release records in Secrets (Helm's default, so the helm
// CLI sees them).
func HelmConfig(kubeconfig, namespace string) (*action.Configuration, error) {
	settings := cli.New()
	settings.KubeConfig = kubeconfig
	cfg := new(action.Configuration)
	if err := cfg.Init(settings.RESTClientGetter(), namespace, "secret", func(string, ...any) {}); err != nil {
		return nil, fmt.Errorf("connect Helm to the cluster: %w", err)
	}
	return cfg, nil
}

// Description is what Orrery writes as a release revision's description
// ('helm history' shows it): how an upgrade tells its own revisions from
// ones made by hand.
func Description(verb string) string {
	return DescriptionPrefix + verb + " " + buildinfo.Get().Version
}

// DescriptionPrefix starts the description of every revision Orrery made.
const DescriptionPrefix = "orrery "

func installOrUpgrade(ctx context.Context, cfg *action.Configuration, name string, c *chart.Chart, values map[string]any, timeout time.Duration) error {
	_, err := action.NewHistory(cfg).Run(name)
	if errors.Is(err, driver.ErrReleaseNotFound) {
		in := action.NewInstall(cfg)
		in.ReleaseName, in.Namespace = name, Namespace
		in.Wait, in.Timeout = true, timeout
		in.Description = Description("init")
		_, err = in.RunWithContext(ctx, c, values)
		return err
	}
	if err != nil {
		return err
	}
	up := action.NewUpgrade(cfg)
	up.Namespace = Namespace
	up.Wait, up.Timeout = true, timeout
	up.Description = Description("init")
	// A failed upgrade rolls back, so the cluster keeps working services.
	up.Atomic = true
	_, err = up.RunWithContext(ctx, name, c, values)
	return err
}

// steadyWorkloads are what a new cluster runs besides its control plane:
// DNS (kubeadm's addon), the pod network and the join and key services.
var steadyWorkloads = struct{ deployments, daemonSets []clusterhealth.Workload }{
	deployments: []clusterhealth.Workload{{Namespace: "kube-system", Name: "coredns"}},
	daemonSets: []clusterhealth.Workload{
		{Namespace: "kube-system", Name: "kube-flannel-ds"},
		{Namespace: Namespace, Name: "orrery-joinservice"},
	},
}

// WaitSteady waits until the cluster of kubeconfig is healthy and stays
// so: an API server that answers once and falls over a minute later is
// not a cluster to hand to the owner.
func WaitSteady(ctx context.Context, kubeconfig string, timeout time.Duration, progress func(msg string)) error {
	client, err := clientFor(kubeconfig)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	err = clusterhealth.WaitSteady(ctx, clusterhealth.Config{
		Client:      client,
		Deployments: steadyWorkloads.deployments,
		DaemonSets:  steadyWorkloads.daemonSets,
		Progress:    progress,
	})
	if err != nil {
		return err
	}
	progress(fmt.Sprintf("control plane steady (%s)", time.Since(start).Round(time.Second)))
	return nil
}
