package kubeadm

import (
	"strings"
	"testing"
)

func TestKubeconfigEndpoint(t *testing.T) {
	kc := func(servers ...string) []byte {
		s := "apiVersion: v1\nkind: Config\nclusters:\n"
		for _, srv := range servers {
			s += "- name: c\n  cluster:\n    server: " + srv + "\n"
		}
		return []byte(s)
	}
	if got, err := kubeconfigEndpoint(kc("https://10.42.0.2:6443")); err != nil || got != "10.42.0.2:6443" {
		t.Fatalf("kubeconfigEndpoint = %q, %v; want 10.42.0.2:6443", got, err)
	}
	for name, tc := range map[string]struct {
		raw  []byte
		want string
	}{
		"two clusters": {kc("https://a:1", "https://b:2"), "names 2 clusters"},
		"none":         {kc(), "names 0 clusters"},
		"http":         {kc("http://10.42.0.2:6443"), "is not https://HOST:PORT"},
		"no port":      {kc("https://10.42.0.2"), "is not HOST:PORT"},
		"path":         {kc("https://10.42.0.2:6443/x"), "is not https://HOST:PORT"},
		"garbage":      {[]byte("\x00\x01: ["), "does not parse"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := kubeconfigEndpoint(tc.raw); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("kubeconfigEndpoint: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
