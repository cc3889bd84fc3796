package upgrade

import (
	"context"
	"fmt"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/orrery-dev/orrery/internal/owner/services"
)

// Cluster is a connection to the cluster an upgrade works on.
type Cluster struct {
	Kubeconfig string
	Dynamic    dynamic.Interface
	Kube       kubernetes.Interface
	// ServerVersion is the API server's Kubernetes version.
	ServerVersion string
	// Host is the API server's URL, as the kubeconfig names it.
	Host string
}

// connectTimeout bounds the first request: an API server that does not
// answer in this time is reported, not waited for.
const connectTimeout = 20 * time.Second

// Connect connects to the cluster of kubeconfig and checks that its API
// server answers.
func Connect(ctx context.Context, kubeconfig string) (*Cluster, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s (pass --kubeconfig: 'orrery init' writes orrery-admin.conf): %w", kubeconfig, err)
	}
	rc.Timeout = connectTimeout
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return nil, err
	}
	v, err := dc.ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("the API server of kubeconfig %s (%s) does not answer: %w; is the cluster up?", kubeconfig, rc.Host, err)
	}
	rc.Timeout = 0
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &Cluster{Kubeconfig: kubeconfig, Dynamic: dyn, Kube: kube, ServerVersion: v.GitVersion, Host: rc.Host}, nil
}

// Helm connects Helm for releases in namespace.
func (c *Cluster) Helm(namespace string) (*action.Configuration, error) {
	return services.HelmConfig(c.Kubeconfig, namespace)
}

// Read returns the state of Orrery's releases in the cluster.
func (c *Cluster) Read() ([]Installed, error) { return Read(c.Helm) }

// Usage lists the cluster's nodes with their images.
func (c *Cluster) Usage(ctx context.Context) ([]NodeImage, error) { return NodeImages(ctx, c.Dynamic) }
