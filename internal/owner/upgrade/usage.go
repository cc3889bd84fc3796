package upgrade

import (
	"context"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/orrery-dev/orrery/internal/records/orreryapi"
)

var (
	admittedNodes = schema.GroupVersionResource{Group: orreryapi.Group, Version: orreryapi.Version, Resource: orreryapi.AdmittedNodes}
	nodes         = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
)

// NodeImage is a node of the cluster and the measurement set (image) it
// last attested with, from the record of admitted nodes.
type NodeImage struct {
	Node string
	// Set is empty if no record names the node's set.
	Set string
}

// NodeImages lists the cluster's nodes with their images. A node without
// a record has an empty Set; a record whose node is gone is left out
// (that node no longer runs anything).
func NodeImages(ctx context.Context, client dynamic.Interface) ([]NodeImage, error) {
	nodeList, err := client.Resource(nodes).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the cluster's nodes: %w", err)
	}
	records, err := client.Resource(admittedNodes).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the record of admitted nodes: %w", err)
	}
	setOf := map[string]string{}
	for _, r := range records.Items {
		spec, _ := r.Object["spec"].(map[string]any)
		inst, _ := spec["instance"].(map[string]any)
		name, _ := inst["name"].(string)
		set, _ := spec["measurementSet"].(string)
		if name != "" && set != "" {
			setOf[name] = set
		}
	}
	var out []NodeImage
	for _, n := range nodeList.Items {
		out = append(out, NodeImage{Node: n.GetName(), Set: setOf[n.GetName()]})
	}
	slices.SortFunc(out, func(a, b NodeImage) int {
		if a.Node < b.Node {
			return -1
		}
		if a.Node > b.Node {
			return 1
		}
		return 0
	})
	return out, nil
}

// InUse maps each set to the nodes that run it.
func InUse(images []NodeImage) map[string][]string {
	out := map[string][]string{}
	for _, n := range images {
		if n.Set != "" {
			out[n.Set] = append(out[n.Set], n.Node)
		}
	}
	return out
}
