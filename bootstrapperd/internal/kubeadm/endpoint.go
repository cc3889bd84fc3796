package kubeadm

import (
	"fmt"
	"net/url"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/orrery-dev/orrery/internal/clustersettings"
)

// Endpoint reads the control-plane endpoint (HOST:PORT) from the admin
// kubeconfig that kubeadm wrote on this control plane: kubeadm names the
// cluster's controlPlaneEndpoint there, on the first control plane and on
// those that joined it alike.
func (t *Tool) Endpoint() (string, error) {
	raw, err := os.ReadFile(t.AdminKubeconfig)
	if err != nil {
		return "", fmt.Errorf("read the control-plane endpoint: %w", err)
	}
	return kubeconfigEndpoint(raw)
}

// kubeconfigEndpoint is the HOST:PORT of the one cluster a kubeconfig
// names.
func kubeconfigEndpoint(raw []byte) (string, error) {
	var kc struct {
		Clusters []struct {
			Cluster struct {
				Server string `json:"server"`
			} `json:"cluster"`
		} `json:"clusters"`
	}
	if err := yaml.Unmarshal(raw, &kc); err != nil {
		return "", fmt.Errorf("the admin kubeconfig does not parse: %w", err)
	}
	if len(kc.Clusters) != 1 {
		return "", fmt.Errorf("the admin kubeconfig names %d clusters, want 1", len(kc.Clusters))
	}
	server := kc.Clusters[0].Cluster.Server
	u, err := url.Parse(server)
	if err != nil || u.Scheme != "https" || u.Path != "" && u.Path != "/" {
		return "", fmt.Errorf("the admin kubeconfig's server %s is not https://HOST:PORT", clustersettings.Quote(server))
	}
	if err := clustersettings.CheckEndpoint(u.Host); err != nil {
		return "", fmt.Errorf("the admin kubeconfig's server: %w", err)
	}
	return u.Host, nil
}
