package kubeadm

import (
	"errors"
	"fmt"
	"reflect"
	"slices"

	"sigs.k8s.io/yaml"
)

// ErrNotClusterConfiguration means a document is not kubeadm's
// ClusterConfiguration in the API version this package writes.
var ErrNotClusterConfiguration = errors.New("not a kubeadm.k8s.io/v1beta4 ClusterConfiguration")

// MoveClusterConfiguration returns doc, the cluster's ClusterConfiguration
// as kubeadm keeps it (the kubeadm-config ConfigMap), with the API
// server's and the controller manager's flags of a cluster made with the
// kubelet-serving CA (see InitConfig): the API server checks kubelets
// against that CA alone, and the controller manager signs their serving
// certificates with it. kubeadm writes every later upgrade's and control
// plane join's static pods from this document, so a cluster moved without
// it would go back to the cluster CA at its next upgrade. Everything else
// in doc is kept. changed is false if doc had those flags already.
func MoveClusterConfiguration(doc []byte) (moved []byte, changed bool, err error) {
	var cc map[string]any
	if err := yaml.Unmarshal(doc, &cc); err != nil {
		return nil, false, fmt.Errorf("%w: %w", ErrNotClusterConfiguration, err)
	}
	if cc["kind"] != "ClusterConfiguration" || cc["apiVersion"] != "kubeadm.k8s.io/v1beta4" {
		return nil, false, fmt.Errorf("%w: it is a %v %v", ErrNotClusterConfiguration, cc["apiVersion"], cc["kind"])
	}
	before, err := yaml.Marshal(cc)
	if err != nil {
		return nil, false, err
	}
	if err := setArgs(cc, "apiServer", []arg{kubeletServingCA}); err != nil {
		return nil, false, err
	}
	if err := setArgs(cc, "controllerManager", signers); err != nil {
		return nil, false, err
	}
	after, err := yaml.Marshal(cc)
	if err != nil {
		return nil, false, err
	}
	if reflect.DeepEqual(before, after) {
		return doc, false, nil
	}
	return after, true, nil
}

// setArgs makes cc's component's extraArgs hold want: an argument of a
// name in want takes its value where it first stands, and a second of
// that name goes (kubeadm would pass both); the others are added at the
// end.
func setArgs(cc map[string]any, component string, want []arg) error {
	sec, _ := cc[component].(map[string]any)
	if sec == nil {
		if cc[component] != nil {
			return fmt.Errorf("%w: %s is not an object", ErrNotClusterConfiguration, component)
		}
		sec = map[string]any{}
		cc[component] = sec
	}
	var have []any
	if sec["extraArgs"] != nil {
		var ok bool
		if have, ok = sec["extraArgs"].([]any); !ok {
			return fmt.Errorf("%w: %s.extraArgs is not a list", ErrNotClusterConfiguration, component)
		}
	}
	wanted := func(name string) int { return slices.IndexFunc(want, func(a arg) bool { return a.Name == name }) }
	placed := make([]bool, len(want))
	var args []any
	for _, a := range have {
		m, ok := a.(map[string]any)
		name, _ := m["name"].(string)
		if !ok || name == "" {
			return fmt.Errorf("%w: %s.extraArgs holds %v, not a name and a value", ErrNotClusterConfiguration, component, a)
		}
		i := wanted(name)
		switch {
		case i < 0:
			args = append(args, a)
		case !placed[i]:
			args = append(args, map[string]any{"name": want[i].Name, "value": want[i].Value})
			placed[i] = true
		}
	}
	for i, w := range want {
		if !placed[i] {
			args = append(args, map[string]any{"name": w.Name, "value": w.Value})
		}
	}
	sec["extraArgs"] = args
	return nil
}
