// Package kubeadmconfig reads kubeadm's record of the cluster: the
// kubeadm-config ConfigMap in kube-system, which 'kubeadm init' writes and
// 'kubeadm upgrade apply' updates, and only cluster administrators
// (kubeadm, the owner) can write. Its ClusterConfiguration's
// kubernetesVersion is the version the cluster runs: the join service
// hands it to joining nodes, and the owner's upgrade moves it.
package kubeadmconfig

import (
	"fmt"

	"sigs.k8s.io/yaml"
)

// Where the record lives.
const (
	Namespace     = "kube-system"
	ConfigMapName = "kubeadm-config"
	// Path is the ConfigMap's path in the API.
	Path = "/api/v1/namespaces/" + Namespace + "/configmaps/" + ConfigMapName
)

// KubernetesVersion reads the cluster's version from the ConfigMap's data.
func KubernetesVersion(data map[string]string) (string, error) {
	var cc struct {
		KubernetesVersion string `json:"kubernetesVersion"`
	}
	if err := yaml.Unmarshal([]byte(data["ClusterConfiguration"]), &cc); err != nil || cc.KubernetesVersion == "" {
		return "", fmt.Errorf("%s/%s holds no ClusterConfiguration with a kubernetesVersion (%v)", Namespace, ConfigMapName, err)
	}
	return cc.KubernetesVersion, nil
}

// ControlPlaneEndpoint reads the control planes' endpoint, HOST:PORT,
// from the ConfigMap's data: the address every kubeconfig and join ticket
// of the cluster names.
func ControlPlaneEndpoint(data map[string]string) (string, error) {
	var cc struct {
		ControlPlaneEndpoint string `json:"controlPlaneEndpoint"`
	}
	if err := yaml.Unmarshal([]byte(data["ClusterConfiguration"]), &cc); err != nil || cc.ControlPlaneEndpoint == "" {
		return "", fmt.Errorf("%s/%s holds no ClusterConfiguration with a controlPlaneEndpoint (%v)", Namespace, ConfigMapName, err)
	}
	return cc.ControlPlaneEndpoint, nil
}
