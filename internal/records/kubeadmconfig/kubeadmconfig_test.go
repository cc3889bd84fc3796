package kubeadmconfig

import (
	"fmt"
	"testing"
)

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

func TestNetworksAndCertSANs(t *testing.T) {
	cc := map[string]string{"ClusterConfiguration": "kind: ClusterConfiguration\nnetworking:\n  serviceSubnet: 10.96.0.0/12,fd00:10:96::/112\n  podSubnet: 10.244.0.1/16\napiServer:\n  certSANs: [api.example.org, 10.42.7.7]\n"}
	services, pods, err := Networks(cc)
	if err != nil || fmt.Sprint(services) != "[10.96.0.0/12 fd00:10:96::/112]" || fmt.Sprint(pods) != "[10.244.0.0/16]" {
		t.Fatalf("Networks = %v, %v, %v", services, pods, err)
	}
	if sans, err := CertSANs(cc); err != nil || fmt.Sprint(sans) != "[api.example.org 10.42.7.7]" {
		t.Fatalf("CertSANs = %v, %v", sans, err)
	}
	for name, data := range map[string]string{
		"no service subnet": "kind: ClusterConfiguration\nnetworking:\n  podSubnet: 10.244.0.0/16\n",
		"a bad pod subnet":  "kind: ClusterConfiguration\nnetworking:\n  serviceSubnet: 10.96.0.0/12\n  podSubnet: 10.244.0.0/33\n",
		"not YAML":          "networking: [x",
	} {
		if _, _, err := Networks(map[string]string{"ClusterConfiguration": data}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
