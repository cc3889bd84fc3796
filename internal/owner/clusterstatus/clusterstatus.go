// Package clusterstatus reports what 'orrery status' shows: the cluster's
// nodes (role, readiness, Kubernetes version, the image each attested
// with) and Orrery's releases (chart version, health, whether this orrery
// carries a newer chart).
package clusterstatus

import (
	"context"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/orrery-dev/orrery/internal/owner/charts"
	"github.com/orrery-dev/orrery/internal/owner/kubeupgrade"
	"github.com/orrery-dev/orrery/internal/owner/upgrade"
)

// Report is the cluster's status.
type Report struct {
	KubernetesVersion string `json:"kubernetesVersion"`
	// Endpoint is the API server the kubeconfig names: the control
	// planes' stable endpoint.
	Endpoint string    `json:"endpoint"`
	Nodes    []Node    `json:"nodes"`
	Releases []Release `json:"releases"`
	// Behind means an 'orrery upgrade apply' would change something.
	Behind bool `json:"behind"`
	// Etcd is etcd's membership, as a control plane told the owner;
	// nil if none was asked.
	Etcd *Etcd `json:"etcd,omitempty"`
}

// Etcd is etcd's membership as a control plane sees it.
type Etcd struct {
	// From is the control plane that answered.
	From    string                   `json:"from,omitempty"`
	Members []kubeupgrade.EtcdMember `json:"members,omitempty"`
	// Error says why no control plane answered.
	Error string `json:"error,omitempty"`
}

// Node is one of the cluster's nodes.
type Node struct {
	Name           string   `json:"name"`
	Roles          []string `json:"roles"`
	Ready          bool     `json:"ready"`
	KubeletVersion string   `json:"kubeletVersion"`
	// Address is the node's internal IP, as its Node lists it.
	Address string `json:"address,omitempty"`
	// Image is the measurement set the node last attested with; empty
	// if no record names it.
	Image string `json:"image,omitempty"`
}

// Release is one of Orrery's releases.
type Release struct {
	Name         string `json:"name"`
	Namespace    string `json:"namespace"`
	ChartVersion string `json:"chartVersion,omitempty"`
	Available    string `json:"availableVersion"`
	Revision     int    `json:"revision,omitempty"`
	Status       string `json:"status"`
	Healthy      bool   `json:"healthy"`
	// Problems say why a release is not healthy.
	Problems []string `json:"problems,omitempty"`
	Behind   bool     `json:"behind"`
}

var (
	nodesResource = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	deployments   = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	daemonSets    = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}
)

// Get reads the cluster's status.
func Get(ctx context.Context, c *upgrade.Cluster) (Report, error) {
	r := Report{KubernetesVersion: c.ServerVersion, Endpoint: c.Host}
	images, err := c.Usage(ctx)
	if err != nil {
		return Report{}, err
	}
	imageOf := map[string]string{}
	for _, n := range images {
		imageOf[n.Node] = n.Set
	}
	list, err := c.Dynamic.Resource(nodesResource).List(ctx, metav1.ListOptions{})
	if err != nil {
		return Report{}, fmt.Errorf("list the cluster's nodes: %w", err)
	}
	for _, n := range list.Items {
		r.Nodes = append(r.Nodes, node(n, imageOf[n.GetName()]))
	}
	slices.SortFunc(r.Nodes, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	installed, err := c.Read()
	if err != nil {
		return Report{}, err
	}
	for _, inst := range installed {
		rel := Release{Name: inst.Ref.Name, Namespace: inst.Ref.Namespace, ChartVersion: inst.ChartVersion, Revision: inst.Revision, Status: string(inst.Status)}
		if ch, err := charts.Load(inst.Ref.Chart); err == nil {
			rel.Available = ch.Metadata.Version
		}
		if plan, err := upgrade.MakePlan([]upgrade.Installed{inst}, charts.Load, upgrade.Options{}); err != nil || plan.Changes() {
			rel.Behind, r.Behind = true, true
		}
		if inst.Missing {
			rel.Status = "not installed"
			rel.Problems = []string{"not installed"}
		} else {
			rel.Problems = workloadProblems(ctx, c, inst.Workloads)
			if inst.Status != "deployed" {
				rel.Problems = append([]string{"release is " + string(inst.Status)}, rel.Problems...)
			}
		}
		rel.Healthy = len(rel.Problems) == 0
		r.Releases = append(r.Releases, rel)
	}
	return r, nil
}

func node(n unstructured.Unstructured, image string) Node {
	out := Node{Name: n.GetName(), Image: image}
	for label := range n.GetLabels() {
		if role, ok := strings.CutPrefix(label, "node-role.kubernetes.io/"); ok && role != "" {
			out.Roles = append(out.Roles, role)
		}
	}
	slices.Sort(out.Roles)
	out.KubeletVersion, _, _ = unstructured.NestedString(n.Object, "status", "nodeInfo", "kubeletVersion")
	addrs, _, _ := unstructured.NestedSlice(n.Object, "status", "addresses")
	for _, a := range addrs {
		if m, _ := a.(map[string]any); m["type"] == "InternalIP" {
			out.Address, _ = m["address"].(string)
		}
	}
	conds, _, _ := unstructured.NestedSlice(n.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Ready" {
			out.Ready = m["status"] == "True"
		}
	}
	return out
}

// workloadProblems says which of a release's workloads are not ready.
func workloadProblems(ctx context.Context, c *upgrade.Cluster, ws []upgrade.Workload) []string {
	var out []string
	for _, w := range ws {
		res, want, ready := deployments, "spec.replicas", "status.readyReplicas"
		if w.Kind == "DaemonSet" {
			res, want, ready = daemonSets, "status.desiredNumberScheduled", "status.numberReady"
		}
		obj, err := c.Dynamic.Resource(res).Namespace(w.Namespace).Get(ctx, w.Name, metav1.GetOptions{})
		if err != nil {
			out = append(out, fmt.Sprintf("%s %s/%s: %v", w.Kind, w.Namespace, w.Name, err))
			continue
		}
		n, found, _ := unstructured.NestedInt64(obj.Object, strings.Split(want, ".")...)
		if !found && w.Kind == "Deployment" {
			n = 1 // the API's default
		}
		got, _, _ := unstructured.NestedInt64(obj.Object, strings.Split(ready, ".")...)
		if got < n || n == 0 {
			out = append(out, fmt.Sprintf("%s %s/%s: %d of %d ready", w.Kind, w.Namespace, w.Name, got, n))
		}
	}
	return out
}
