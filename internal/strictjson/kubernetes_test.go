package strictjson

import (
	"strings"
	"testing"
)

func TestKubernetesYAMLMatchesNamesExactly(t *testing.T) {
	type cluster struct {
		Server string `json:"server"`
	}
	var c cluster
	if err := KubernetesYAML([]byte("Server: https://203.0.113.9\nserver: https://10.0.2.5\n"), &c); err != nil || c.Server != "https://10.0.2.5" {
		t.Fatalf("an upper-case copy: server %q, %v; want the exact member's", c.Server, err)
	}
	c = cluster{}
	if err := KubernetesYAML([]byte("SERVER: https://203.0.113.9\n"), &c); err != nil || c.Server != "" {
		t.Fatalf("only an upper-case member: server %q, %v; want none read", c.Server, err)
	}
	err := KubernetesYAML([]byte("a:\n- b:\n    ſerver: https://203.0.113.9\n"), &map[string]any{})
	if err == nil || !strings.Contains(err.Error(), "a[0].b") {
		t.Fatalf("a member with a long s: %v, want a refusal naming where", err)
	}
	var m map[string]any
	if err := KubernetesYAML([]byte("readOnlyPort: 0\n"), &m); err != nil || m["readOnlyPort"] != int64(0) {
		t.Fatalf("an integer: %#v, %v; want int64 as Kubernetes reads it", m["readOnlyPort"], err)
	}
	if err := KubernetesYAML([]byte("\x00{["), &m); err == nil {
		t.Fatal("garbage decoded")
	}
}
