// Package nodeconfig checks the containerd configuration the OS image
// ships (units/etc/containerd/config.toml) against the containerd the
// image ships. containerd ignores keys it does not know, so a misspelt
// or misplaced setting would silently fall back to its default.
package nodeconfig

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/orrery-dev/orrery/image/components/containerd/internal/containerdtest"
)

// nodeConfig is the file the image installs as /etc/containerd/config.toml.
var nodeConfig = filepath.Join("..", "..", "..", "..", "units", "etc", "containerd", "config.toml")

// TestNodeConfigTakesEffect has the pinned containerd print the
// configuration it would run with (`containerd config dump`) and checks
// that each of our settings is in it, where the plugin reads it.
func TestNodeConfigTakesEffect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := containerdtest.Build(ctx, t, t.TempDir())
	dump, err := exec.CommandContext(ctx, bin, "--config", nodeConfig, "config", "dump").Output()
	if err != nil {
		t.Fatalf("containerd config dump of %s: %v", nodeConfig, err)
	}
	var got map[string]any
	if err := toml.Unmarshal(dump, &got); err != nil {
		t.Fatalf("containerd's config dump is not TOML: %v\n%s", err, dump)
	}
	const (
		images  = "io.containerd.cri.v1.images"
		runtime = "io.containerd.cri.v1.runtime"
	)
	for _, c := range []struct {
		path []string
		want any
	}{
		{[]string{"plugins", images, "snapshotter"}, "overlayfs"},
		{[]string{"plugins", images, "pinned_images", "sandbox"}, "registry.k8s.io/pause:3.10.2"},
		{[]string{"plugins", runtime, "stats_collect_period"}, "10s"},
		{[]string{"plugins", runtime, "containerd", "runtimes", "runc", "runtime_type"}, "io.containerd.runc.v2"},
		{[]string{"plugins", runtime, "containerd", "runtimes", "runc", "options", "SystemdCgroup"}, true},
		{[]string{"plugins", runtime, "cni", "bin_dirs"}, []any{"/opt/cni/bin"}},
		{[]string{"plugins", runtime, "cni", "conf_dir"}, "/etc/cni/net.d"},
	} {
		v, err := lookup(got, c.path)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if fmt.Sprint(v) != fmt.Sprint(c.want) {
			t.Errorf("%v = %v in containerd's config dump, want %v: check the key's name and table in %s", c.path, v, c.want, nodeConfig)
		}
	}
}

func lookup(m map[string]any, path []string) (any, error) {
	var v any = m
	for i, key := range path {
		table, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%v is not a table in containerd's config dump", path[:i])
		}
		if v, ok = table[key]; !ok {
			return nil, fmt.Errorf("%v is missing from containerd's config dump", path[:i+1])
		}
	}
	return v, nil
}
