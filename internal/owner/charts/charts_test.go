package charts

import (
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"sigs.k8s.io/yaml"

	"github.com/orrery-dev/orrery/internal/buildinfo"
)

const digest = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

// servicesValues are orrery-services values as 'orrery init' passes them.
func servicesValues() map[string]any {
	return map[string]any{"endpoint": "10.42.1.100:6443", "platformCA": "PEM", "measurementSets": []any{
		map[string]any{"name": "image-0123456789abcdef", "description": "v1", "measurements": map[string]any{"4": map[string]any{"expected": digest, "warnOnly": false}}},
	}}
}

// render renders the embedded chart name with values as release "r" in
// kube-system, as 'orrery init' installs it.
func render(t *testing.T, name string, values map[string]any) map[string]string {
	t.Helper()
	c, err := Load(name)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ToRenderValues(c, values, chartutil.ReleaseOptions{Name: "r", Namespace: "kube-system"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(c, vals)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestChartsRender renders each embedded chart with the values orrery init
// passes and checks the objects a cluster depends on are there.
func TestChartsRender(t *testing.T) {
	tests := map[string]struct {
		values  map[string]any
		want    []string
		wantErr string
	}{
		Flannel: {values: map[string]any{"podCIDR": "10.244.0.0/16", "apiServer": map[string]any{"host": "10.42.1.100", "port": "6443"}},
			want: []string{"kind: DaemonSet", `"Network": "10.244.0.0/16"`, "imagePullPolicy: Never", "10-flannel.conflist",
				// flanneld must not depend on kube-proxy to reach the API server.
				"name: KUBERNETES_SERVICE_HOST\n              value: \"10.42.1.100\"", "name: KUBERNETES_SERVICE_PORT\n              value: \"6443\"",
				// The node's network is ready (CNI config) only once flanneld has a subnet.
				"until [ -s /run/flannel/subnet.env ]; do busybox sleep 1 & wait $!; done\n              cp -f /etc/kube-flannel/cni-conf.json /etc/cni/net.d/10-flannel.conflist",
				// As PID 1 it must end on SIGTERM, or stopping the pod waits for SIGKILL.
				"trap 'exit 0' TERM INT"}},
		Flannel + " without the API server": {values: map[string]any{"podCIDR": "10.244.0.0/16"}, wantErr: "apiServer.host is required"},
		OrreryServices: {values: servicesValues(),
			want: []string{"kind: DaemonSet", "--endpoint=10.42.1.100:6443", "hostPort: 30090", "defaultMode: 0400", "node-role.kubernetes.io/control-plane",
				"--key-service=/var/run/orrery/keyservice/keys.sock", `"--listen", "/var/run/orrery/keyservice/keys.sock"`, "name: key-service\n          emptyDir",
				// The join service attests on its node's vTPM, with its logs.
				"--measurement-log=/var/run/orrery/node/measurements.log", "path: /run/orrery/measurements.log, type: File",
				"path: /sys/kernel/security/tpm0, type: Directory",
				// The join service must not depend on kube-proxy to reach the API server.
				"name: KUBERNETES_SERVICE_HOST\n              valueFrom: {fieldRef: {fieldPath: status.hostIP}}",
				"name: KUBERNETES_SERVICE_PORT\n              value: \"6443\"",
				// One MeasurementSet per accepted image, as the values name it.
				"kind: MeasurementSet\nmetadata:\n  name: image-0123456789abcdef\nspec:\n  description: \"v1\"\n  measurements: {\"4\":{\"expected\":\"" + digest + "\",\"warnOnly\":false}}"}},
		OrreryServices + " without measurements": {values: map[string]any{"endpoint": "x:1", "platformCA": "PEM"}, wantErr: "measurementSets are required"},
		OrreryCRDs:                               {values: map[string]any{}, want: []string{"name: measurementsets.orrery.dev", "name: admittednodes.orrery.dev", "helm.sh/resource-policy: keep"}},
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

// Only the join container, which quotes on the node's vTPM, is privileged;
// the key service, which holds the master secret, is not.
func TestOnlyJoinContainerPrivileged(t *testing.T) {
	out := render(t, OrreryServices, servicesValues())
	type container struct {
		Name            string
		SecurityContext *struct{ Privileged *bool }
	}
	var ds struct {
		Kind string
		Spec struct {
			Template struct {
				Spec struct{ Containers []container }
			}
		}
	}
	for _, manifest := range out {
		for _, doc := range strings.Split(manifest, "\n---") {
			if err := yaml.Unmarshal([]byte(doc), &ds); err == nil && ds.Kind == "DaemonSet" {
				break
			}
		}
		if ds.Kind == "DaemonSet" {
			break
		}
	}
	privileged := map[string]bool{}
	for _, ct := range ds.Spec.Template.Spec.Containers {
		privileged[ct.Name] = ct.SecurityContext != nil && ct.SecurityContext.Privileged != nil && *ct.SecurityContext.Privileged
	}
	if len(privileged) != 2 || !privileged["join"] || privileged["keys"] {
		t.Fatalf("privileged containers: %v; want only join", privileged)
	}
}

// TestChartsCarryTheBuildVersion: an upgrade compares these versions with
// the installed releases', so they must be the CLI's.
func TestChartsCarryTheBuildVersion(t *testing.T) {
	defer func(v string) { buildinfo.Version = v }(buildinfo.Version)
	buildinfo.Version = "7.8.9-rc.1"
	versions, err := Versions()
	if err != nil {
		t.Fatal(err)
	}
	if len(versions) != 3 || versions[Flannel] != "7.8.9-rc.1" || versions[OrreryServices] != "7.8.9-rc.1" || versions[OrreryCRDs] != "7.8.9-rc.1" {
		t.Fatalf("chart versions %v, want all 7.8.9-rc.1", versions)
	}
	c, err := Load(OrreryServices)
	if err != nil {
		t.Fatal(err)
	}
	if c.Metadata.AppVersion != "7.8.9-rc.1" {
		t.Errorf("orrery-services app version %q, want the build's", c.Metadata.AppVersion)
	}
	if f, _ := Load(Flannel); f.Metadata.AppVersion != "v0.28.4" {
		t.Errorf("flannel app version %q, want upstream's v0.28.4", f.Metadata.AppVersion)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("the stamped chart does not validate: %v", err)
	}
}

// TestFlannelSubnetFileSurvivesReboots: the CNI plugin must read the file
// that flanneld writes, and that file must be on the state disk (under
// /var), not in /run: after a reboot kubelet starts sandboxes before
// flanneld runs again, and each failed without the file.
func TestFlannelSubnetFileSurvivesReboots(t *testing.T) {
	out := render(t, Flannel, map[string]any{"podCIDR": "10.244.0.0/16", "apiServer": map[string]any{"host": "10.42.1.100", "port": "6443"}})
	type mount struct{ Name, MountPath string }
	var obj struct {
		Kind string
		Data map[string]string
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Name         string
						Command      []string
						VolumeMounts []mount `json:"volumeMounts"`
					}
					Volumes []struct {
						Name     string
						HostPath *struct{ Path string } `json:"hostPath"`
					}
				}
			}
		}
	}
	var cniConf, flanneldDir string
	hostPaths := map[string]string{}
	for _, manifest := range out {
		for _, doc := range strings.Split(manifest, "\n---") {
			obj.Kind, obj.Data = "", nil
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatalf("rendered manifest: %v", err)
			}
			switch obj.Kind {
			case "ConfigMap":
				cniConf = obj.Data["cni-conf.json"]
			case "DaemonSet":
				for _, v := range obj.Spec.Template.Spec.Volumes {
					if v.HostPath != nil {
						hostPaths[v.Name] = v.HostPath.Path
					}
				}
				for _, ctr := range obj.Spec.Template.Spec.Containers {
					if ctr.Name != "kube-flannel" {
						continue
					}
					for _, m := range ctr.VolumeMounts {
						// flanneld writes /run/flannel/subnet.env unless told otherwise.
						if m.MountPath == "/run/flannel" && !strings.Contains(strings.Join(ctr.Command, " "), "--subnet-file") {
							flanneldDir = m.Name
						}
					}
				}
			}
		}
	}
	var conf struct {
		Plugins []struct {
			Type       string
			SubnetFile string `json:"subnetFile"`
		}
	}
	if err := yaml.Unmarshal([]byte(cniConf), &conf); err != nil || len(conf.Plugins) == 0 || conf.Plugins[0].Type != "flannel" {
		t.Fatalf("CNI configuration %q: %v", cniConf, err)
	}
	written := hostPaths[flanneldDir] + "/subnet.env"
	if flanneldDir == "" || hostPaths[flanneldDir] == "" {
		t.Fatalf("flanneld's /run/flannel is no host directory (volumes %v)", hostPaths)
	}
	if read := conf.Plugins[0].SubnetFile; read != written {
		t.Errorf("the CNI plugin reads %q, flanneld writes %q on the host", read, written)
	}
	if !strings.HasPrefix(written, "/var/lib/") {
		t.Errorf("flanneld's subnet file is at %s on the host, which a reboot empties; want it under /var/lib (the state disk)", written)
	}
}
