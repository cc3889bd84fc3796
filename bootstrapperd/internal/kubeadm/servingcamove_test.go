package kubeadm

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"sigs.k8s.io/yaml"
)

// clusterConfiguration returns the ClusterConfiguration document of
// InitConfig(p).
func clusterConfigurationOf(t *testing.T, p InitParams) []byte {
	t.Helper()
	cfg, err := InitConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range bytes.Split(cfg, []byte("---\n")) {
		if bytes.Contains(doc, []byte("kind: ClusterConfiguration")) {
			return doc
		}
	}
	t.Fatal("InitConfig wrote no ClusterConfiguration")
	return nil
}

func asMap(t *testing.T, doc []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal(doc, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// A cluster made before the kubelet-serving CA, once moved, has the
// configuration of a cluster made with it: nothing more, nothing less.
func TestMoveClusterConfigurationGivesInitsOwn(t *testing.T) {
	old := clusterConfigurationOf(t, cp0)
	withCA := cp0
	withCA.KubeletServingCA = true
	want := asMap(t, clusterConfigurationOf(t, withCA))
	if reflect.DeepEqual(asMap(t, old), want) {
		t.Fatal("the two configurations are the same: the test checks nothing")
	}
	moved, changed, err := MoveClusterConfiguration(old)
	if err != nil || !changed {
		t.Fatalf("MoveClusterConfiguration = changed %t, %v", changed, err)
	}
	if got := asMap(t, moved); !reflect.DeepEqual(got, want) {
		t.Fatalf("moved:\n%s\nwant the configuration of a cluster made with the CA:\n%s", moved, clusterConfigurationOf(t, withCA))
	}
	again, changed, err := MoveClusterConfiguration(moved)
	if err != nil || changed || !bytes.Equal(again, moved) {
		t.Fatalf("moving a moved configuration: changed %t, %v", changed, err)
	}
}

// A flag that names the cluster CA twice leaves no copy behind, and a
// component without extraArgs gets them.
func TestMoveClusterConfigurationReplacesEveryCopy(t *testing.T) {
	doc := []byte(`apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
apiServer:
  extraArgs:
  - {name: kubelet-certificate-authority, value: /etc/kubernetes/pki/ca.crt}
  - {name: profiling, value: "false"}
  - {name: kubelet-certificate-authority, value: /etc/kubernetes/pki/ca.crt}
`)
	moved, _, err := MoveClusterConfiguration(doc)
	if err != nil {
		t.Fatal(err)
	}
	var cc struct {
		APIServer         struct{ ExtraArgs []arg } `json:"apiServer"`
		ControllerManager struct{ ExtraArgs []arg } `json:"controllerManager"`
	}
	if err := yaml.Unmarshal(moved, &cc); err != nil {
		t.Fatal(err)
	}
	if want := []arg{kubeletServingCA, {Name: "profiling", Value: "false"}}; !reflect.DeepEqual(cc.APIServer.ExtraArgs, want) {
		t.Errorf("the API server's arguments: %v, want %v", cc.APIServer.ExtraArgs, want)
	}
	if !reflect.DeepEqual(cc.ControllerManager.ExtraArgs, signers) {
		t.Errorf("the controller manager's arguments: %v, want %v", cc.ControllerManager.ExtraArgs, signers)
	}
}

func TestMoveClusterConfigurationRefusesOtherDocuments(t *testing.T) {
	for name, doc := range map[string]string{
		"garbage":      "{{{",
		"another kind": "apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\n",
		"old version":  "apiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\n",
		"args no list": "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\napiServer:\n  extraArgs: {a: b}\n",
		"arg no name":  "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\napiServer:\n  extraArgs: [3]\n",
		"not object":   "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\napiServer: 3\n",
	} {
		if _, _, err := MoveClusterConfiguration([]byte(doc)); !errors.Is(err, ErrNotClusterConfiguration) {
			t.Errorf("%s: %v, want ErrNotClusterConfiguration", name, err)
		}
	}
}
