package charts

import (
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
)

// TestChartsRender renders each embedded chart with the values orrery init
// passes and checks the objects a cluster depends on are there.
func TestChartsRender(t *testing.T) {
	tests := map[string]struct {
		values  map[string]any
		want    []string
		wantErr string
	}{
		Flannel: {values: map[string]any{"podCIDR": "10.244.0.0/16"},
			want: []string{"kind: DaemonSet", `"Network": "10.244.0.0/16"`, "imagePullPolicy: Never", "10-flannel.conflist"}},
		OrreryServices: {values: map[string]any{"endpoint": "10.42.1.100:6443", "measurements": `{"4":{}}`, "platformCA": "PEM"},
			want: []string{"kind: DaemonSet", "--endpoint=10.42.1.100:6443", "hostPort: 30090", "defaultMode: 0400", "node-role.kubernetes.io/control-plane",
				"--key-service=/var/run/orrery/keyservice/keys.sock", `"--listen", "/var/run/orrery/keyservice/keys.sock"`, "name: key-service\n          emptyDir"}},
		OrreryServices + " without measurements": {values: map[string]any{"endpoint": "x:1", "platformCA": "PEM"}, wantErr: "measurements are required"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c, err := Load(strings.Fields(name)[0])
			if err != nil {
				t.Fatal(err)
			}
			vals, err := chartutil.ToRenderValues(c, tc.values, chartutil.ReleaseOptions{Name: "r", Namespace: "kube-system"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			out, err := engine.Render(c, vals)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var all strings.Builder
			for _, s := range out {
				all.WriteString(s)
			}
			for _, w := range tc.want {
				if !strings.Contains(all.String(), w) {
					t.Errorf("rendered chart lacks %q", w)
				}
			}
		})
	}
}
