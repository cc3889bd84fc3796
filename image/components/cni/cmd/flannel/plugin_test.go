package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadSubnetEnv(t *testing.T) {
	testCases := map[string]struct {
		content string
		wantErr string
	}{
		"complete":        {content: "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"},
		"no subnet":       {content: "FLANNEL_NETWORK=10.244.0.0/16\n", wantErr: "FLANNEL_SUBNET missing"},
		"bad mtu":         {content: "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=big\n", wantErr: "FLANNEL_MTU"},
		"bad subnet cidr": {content: "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1\n", wantErr: "FLANNEL_SUBNET"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "subnet.env")
			if err := os.WriteFile(p, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			env, err := readSubnetEnv(p)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if env.subnet.String() != "10.244.1.0/24" || env.network.String() != "10.244.0.0/16" || env.mtu != 1450 || !env.ipMasq {
				t.Errorf("got %+v", env)
			}
		})
	}
	if _, err := readSubnetEnv(filepath.Join(t.TempDir(), "absent")); err == nil || !strings.Contains(err.Error(), "is flanneld running") {
		t.Errorf("missing file: error = %v", err)
	}
}

func TestDelegateConf(t *testing.T) {
	p := filepath.Join(t.TempDir(), "subnet.env")
	if err := os.WriteFile(p, []byte("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env, err := readSubnetEnv(p)
	if err != nil {
		t.Fatal(err)
	}
	c, err := loadConf([]byte(`{"cniVersion":"1.0.0","name":"cbr0","type":"flannel","delegate":{"hairpinMode":false,"mtu":1400}}`))
	if err != nil {
		t.Fatal(err)
	}
	raw, typ, err := delegateConf(c, env)
	if err != nil {
		t.Fatal(err)
	}
	if typ != "bridge" {
		t.Errorf("type = %q, want bridge", typ)
	}
	var got map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if got["name"] != "cbr0" || got["cniVersion"] != "1.0.0" || got["hairpinMode"] != false || got["mtu"] != float64(1400) || got["ipMasq"] != false {
		t.Errorf("delegate = %s", raw)
	}
	ipam, _ := json.Marshal(got["ipam"])
	if want := `{"ranges":[[{"subnet":"10.244.1.0/24"}]],"routes":[{"dst":"10.244.0.0/16"}],"type":"host-local"}`; string(ipam) != want {
		t.Errorf("ipam = %s, want %s", ipam, want)
	}
}

func TestSavedPathRejectsTraversal(t *testing.T) {
	c := &netConf{DataDir: "/var/lib/cni/flannel"}
	for _, id := range []string{"", ".", "..", "../x", "a/b"} {
		if _, err := savedPath(c, id); err == nil {
			t.Errorf("savedPath(%q) = nil error", id)
		}
	}
}
