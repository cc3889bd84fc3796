package kubeupgrade

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/owner/drain"
)

// cordon marks node unschedulable for the upgrade to version, unless it
// is already (the owner's cordon, which uncordon then leaves alone). It
// reads the Node afresh: the plan may be an hour old, and a cordon the
// owner made since must stay the owner's.
func cordon(ctx context.Context, client kubernetes.Interface, n Node, version string) error {
	node, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read node %s: %w", n.Name, err)
	}
	if node.Spec.Unschedulable {
		return nil
	}
	return patchNode(ctx, client, n.Name, true, version)
}

// uncordon undoes the upgrade's cordon of node, if it made one.
func uncordon(ctx context.Context, client kubernetes.Interface, name string) error {
	node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read node %s: %w", name, err)
	}
	if _, ours := node.Annotations[CordonedAnnotation]; !ours {
		return nil
	}
	return patchNode(ctx, client, name, false, "")
}

func patchNode(ctx context.Context, client kubernetes.Interface, name string, unschedulable bool, version string) error {
	var annotation any // JSON null removes it
	if version != "" {
		annotation = version
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{CordonedAnnotation: annotation}},
		"spec":     map[string]any{"unschedulable": unschedulable},
	})
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		verb := "uncordon"
		if unschedulable {
			verb = "cordon"
		}
		return fmt.Errorf("%s node %s: %w", verb, name, err)
	}
	return nil
}

// drainNode evicts node's pods, waiting for those a PodDisruptionBudget
// keeps until timeout, then fails: a worker is upgraded only once it
// serves nothing.
func drainNode(ctx context.Context, client kubernetes.Interface, node string, timeout time.Duration, say func(string, ...any)) error {
	left, err := drain.Drain(ctx, client, node, timeout, func(format string, args ...any) { say("  "+format, args...) })
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("node %s was not drained within %s: %s still there (a PodDisruptionBudget may forbid their eviction: 'kubectl get pdb -A')", node, timeout, drain.Names(left))
	}
	return nil
}
