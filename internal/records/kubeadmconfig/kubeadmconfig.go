// Package kubeadmconfig reads kubeadm's record of the cluster: the
// kubeadm-config ConfigMap in kube-system, which 'kubeadm init' writes and
// 'kubeadm upgrade apply' updates, and only cluster administrators
// (kubeadm, the owner) can write. Its ClusterConfiguration's
// kubernetesVersion is the version the cluster runs: the join service
// hands it to joining nodes, and the owner's upgrade moves it.
package kubeadmconfig

import (
	"fmt"
	"net/netip"
	"strings"

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

// Networks reads the cluster's Service and pod networks from the
// ConfigMap's data (each may list an IPv4 and an IPv6 range, comma
// separated). A ClusterConfiguration without them is an error: a reader
// that checks addresses against them must not take "none" for an answer.
func Networks(data map[string]string) (services, pods []netip.Prefix, err error) {
	var cc struct {
		Networking struct {
			ServiceSubnet string `json:"serviceSubnet"`
			PodSubnet     string `json:"podSubnet"`
		} `json:"networking"`
	}
	if err := yaml.Unmarshal([]byte(data["ClusterConfiguration"]), &cc); err != nil {
		return nil, nil, fmt.Errorf("%s/%s holds no ClusterConfiguration (%v)", Namespace, ConfigMapName, err)
	}
	if services, err = prefixes("serviceSubnet", cc.Networking.ServiceSubnet); err != nil {
		return nil, nil, err
	}
	if pods, err = prefixes("podSubnet", cc.Networking.PodSubnet); err != nil {
		return nil, nil, err
	}
	return services, pods, nil
}

func prefixes(field, list string) ([]netip.Prefix, error) {
	if strings.TrimSpace(list) == "" {
		return nil, fmt.Errorf("%s/%s's ClusterConfiguration has no networking.%s", Namespace, ConfigMapName, field)
	}
	var out []netip.Prefix
	for _, s := range strings.Split(list, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%s/%s's networking.%s: %w", Namespace, ConfigMapName, field, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// CertSANs reads the extra names and addresses of the API server's
// serving certificate (apiServer.certSANs), which the owner chose at
// init; none is fine.
func CertSANs(data map[string]string) ([]string, error) {
	var cc struct {
		APIServer struct {
			CertSANs []string `json:"certSANs"`
		} `json:"apiServer"`
	}
	if err := yaml.Unmarshal([]byte(data["ClusterConfiguration"]), &cc); err != nil {
		return nil, fmt.Errorf("%s/%s holds no ClusterConfiguration (%v)", Namespace, ConfigMapName, err)
	}
	return cc.APIServer.CertSANs, nil
}
