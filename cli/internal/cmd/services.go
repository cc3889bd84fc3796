package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/cli"
	"helm.sh/helm/v3/pkg/storage/driver"

	"github.com/orrery-dev/orrery/cli/internal/charts"
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
func installServices(ctx context.Context, out io.Writer, kubeconfig string, releases []serviceRelease, timeout time.Duration) error {
	settings := cli.New()
	settings.KubeConfig = kubeconfig
	cfg := new(action.Configuration)
	if err := cfg.Init(settings.RESTClientGetter(), servicesNamespace, "secret", func(string, ...any) {}); err != nil {
		return fmt.Errorf("connect Helm to the cluster: %w", err)
	}
	for _, r := range releases {
		start := time.Now()
		c, err := charts.Load(r.chart)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "  installing %s (chart %s %s)\n", r.name, c.Metadata.Name, c.Metadata.Version)
		if err := installOrUpgrade(ctx, cfg, r.name, c, r.values, timeout); err != nil {
			return fmt.Errorf("install %s: %w", r.name, err)
		}
		fmt.Fprintf(out, "  %s runs (%s)\n", r.name, time.Since(start).Round(time.Second))
	}
	return nil
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
