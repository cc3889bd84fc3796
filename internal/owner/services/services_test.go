package services

import (
	"testing"
)

func TestReleases(t *testing.T) {
	rs, err := Releases(Settings{APIServer: "10.42.1.100:6443", PodCIDR: "10.244.0.0/16", KubernetesVersion: "v1.36.3",
		Measurements: []byte(`{"11":{"expected":"00"}}`), PlatformCA: []byte("PEM")})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Release{}
	for _, r := range rs {
		byName[r.Name] = r
	}
	// flanneld reaches the API server directly: it must not wait for
	// kube-proxy's Service rules, which need the pod network first.
	api, _ := byName["flannel"].Values["apiServer"].(map[string]any)
	if api["host"] != "10.42.1.100" || api["port"] != "6443" || byName["flannel"].Values["podCIDR"] != "10.244.0.0/16" {
		t.Errorf("flannel values %v", byName["flannel"].Values)
	}
	svc := byName["orrery-services"].Values
	if svc["endpoint"] != "10.42.1.100:6443" || svc["apiServerPort"] != "6443" || svc["measurements"] != `{"11":{"expected":"00"}}` || svc["platformCA"] != "PEM" {
		t.Errorf("orrery-services values %v", svc)
	}
	if _, err := Releases(Settings{APIServer: "10.42.1.100"}); err == nil {
		t.Error("an API server address without a port was accepted")
	}
}
