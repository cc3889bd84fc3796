package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/cli"
	"helm.sh/helm/v3/pkg/storage/driver"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/orrery-dev/orrery/cli/internal/charts"
	"github.com/orrery-dev/orrery/internal/clusterhealth"
)

// servicesNamespace holds Orrery's cluster services and their releases.
const servicesNamespace = "kube-system"

// serviceRelease is one chart `orrery init` installs.
type serviceRelease struct {
	name   string
	chart  string
	values map[string]any
}

// installServices installs or upgrades the cluster services with Helm and
// waits until they run. Installing again (a retried init) upgrades in place.
// The releases do not depend on each other (the join service is on the
// host network), so they install side by side: on a slow machine most of
// each install is waiting for its pods.
func installServices(ctx context.Context, out io.Writer, kubeconfig string, releases []serviceRelease, timeout time.Duration) error {
	out = &lockedWriter{w: out}
	g, ctx := errgroup.WithContext(ctx)
	for _, r := range releases {
		g.Go(func() error {
			start := time.Now()
			c, err := charts.Load(r.chart)
			if err != nil {
				return err
			}
			// One Helm configuration per release: its client and
			// release storage are not meant to be shared between
			// goroutines.
			settings := cli.New()
			settings.KubeConfig = kubeconfig
			cfg := new(action.Configuration)
			if err := cfg.Init(settings.RESTClientGetter(), servicesNamespace, "secret", func(string, ...any) {}); err != nil {
				return fmt.Errorf("connect Helm to the cluster: %w", err)
			}
			fmt.Fprintf(out, "  installing %s (chart %s %s)\n", r.name, c.Metadata.Name, c.Metadata.Version)
			if err := installOrUpgrade(ctx, cfg, r.name, c, r.values, timeout); err != nil {
				return fmt.Errorf("install %s: %w", r.name, err)
			}
			fmt.Fprintf(out, "  %s runs (%s)\n", r.name, time.Since(start).Round(time.Second))
			return nil
		})
	}
	return g.Wait()
}

// lockedWriter lets goroutines write whole lines to one writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func installOrUpgrade(ctx context.Context, cfg *action.Configuration, name string, c *chart.Chart, values map[string]any, timeout time.Duration) error {
	_, err := action.NewHistory(cfg).Run(name)
	if errors.Is(err, driver.ErrReleaseNotFound) {
		in := action.NewInstall(cfg)
		in.ReleaseName, in.Namespace = name, servicesNamespace
		in.Wait, in.Timeout = true, timeout
		_, err = in.RunWithContext(ctx, c, values)
		return err
	}
	if err != nil {
		return err
	}
	up := action.NewUpgrade(cfg)
	up.Namespace = servicesNamespace
	up.Wait, up.Timeout = true, timeout
	// A failed upgrade rolls back, so the cluster keeps working services.
	up.Atomic = true
	_, err = up.RunWithContext(ctx, name, c, values)
	return err
}

// steadyTimeout bounds how long init waits for a healthy control plane
// after installing the services.
const steadyTimeout = 10 * time.Minute

// steadyWorkloads are what a new cluster runs besides its control plane:
// DNS (kubeadm's addon), the pod network and the join and key services.
var steadyWorkloads = struct{ deployments, daemonSets []clusterhealth.Workload }{
	deployments: []clusterhealth.Workload{{Namespace: "kube-system", Name: "coredns"}},
	daemonSets: []clusterhealth.Workload{
		{Namespace: "kube-system", Name: "kube-flannel-ds"},
		{Namespace: servicesNamespace, Name: "orrery-joinservice"},
	},
}

// waitSteady waits until the cluster of kubeconfig is healthy and stays
// so: an API server that answers once and falls over a minute later is
// not a cluster to hand to the owner.
func waitSteady(ctx context.Context, out io.Writer, kubeconfig string, timeout time.Duration) error {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("read kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("connect to the cluster: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	err = clusterhealth.WaitSteady(ctx, clusterhealth.Config{
		Client:      client,
		Deployments: steadyWorkloads.deployments,
		DaemonSets:  steadyWorkloads.daemonSets,
		Progress:    out,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  control plane steady (%s)\n", time.Since(start).Round(time.Second))
	return nil
}
