package kubeadmconfig

import "testing"

func TestKubernetesVersion(t *testing.T) {
	for name, c := range map[string]struct {
		data    map[string]string
		want    string
		wantErr bool
	}{
		"kubeadm's":  {map[string]string{"ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: v1.37.2\n"}, "v1.37.2", false},
		"no version": {map[string]string{"ClusterConfiguration": "kind: ClusterConfiguration\n"}, "", true},
		"not YAML":   {map[string]string{"ClusterConfiguration": "kubernetesVersion: [v1"}, "", true},
		"no config":  {map[string]string{}, "", true},
		"nil":        {nil, "", true},
	} {
		got, err := KubernetesVersion(c.data)
		if got != c.want || (err != nil) != c.wantErr {
			t.Errorf("%s: KubernetesVersion = %q, %v; want %q, error %v", name, got, err, c.want, c.wantErr)
		}
	}
}

func TestControlPlaneEndpoint(t *testing.T) {
	for name, c := range map[string]struct {
		data    map[string]string
		want    string
		wantErr bool
	}{
		"kubeadm's":   {map[string]string{"ClusterConfiguration": "kind: ClusterConfiguration\ncontrolPlaneEndpoint: 10.42.0.2:6443\n"}, "10.42.0.2:6443", false},
		"no endpoint": {map[string]string{"ClusterConfiguration": "kind: ClusterConfiguration\n"}, "", true},
		"not YAML":    {map[string]string{"ClusterConfiguration": "controlPlaneEndpoint: [x"}, "", true},
		"nil":         {nil, "", true},
	} {
		got, err := ControlPlaneEndpoint(c.data)
		if got != c.want || (err != nil) != c.wantErr {
			t.Errorf("%s: ControlPlaneEndpoint = %q, %v; want %q, error %v", name, got, err, c.want, c.wantErr)
		}
	}
}
