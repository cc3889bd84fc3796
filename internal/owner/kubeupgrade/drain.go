package kubeupgrade

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// cordon marks node unschedulable for the upgrade to version, unless it
// is already (the owner's cordon, which uncordon then leaves alone).
func cordon(ctx context.Context, client kubernetes.Interface, n Node, version string) error {
	if n.Cordoned {
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

// drain evicts the pods of node that a drain moves: not those of
// DaemonSets, which run on every node whatever, nor static pods, nor
// finished ones. An eviction a PodDisruptionBudget forbids now is asked
// again until timeout; drain returns once every evicted pod is gone.
func drain(ctx context.Context, client kubernetes.Interface, node string, timeout time.Duration, say func(string, ...any)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pods, err := podsToEvict(ctx, client, node)
	if err != nil {
		return err
	}
	for _, p := range pods {
		if metav1.GetControllerOf(&p) == nil {
			say("  evicting pod %s/%s, which no controller makes again: it is gone for good", p.Namespace, p.Name)
		}
	}
	for len(pods) > 0 {
		var blocked []string
		for _, p := range pods {
			err := client.PolicyV1().Evictions(p.Namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
			switch {
			case err == nil || apierrors.IsNotFound(err):
			case apierrors.IsTooManyRequests(err):
				blocked = append(blocked, p.Namespace+"/"+p.Name)
			default:
				return fmt.Errorf("evict pod %s/%s from node %s: %w", p.Namespace, p.Name, node, err)
			}
		}
		if pods, err = podsToEvict(ctx, client, node); err != nil {
			return err
		}
		if len(pods) == 0 {
			return nil
		}
		if len(blocked) > 0 {
			say("waiting: a PodDisruptionBudget keeps %s on %s for now", strings.Join(blocked, ", "), node)
		}
		select {
		case <-ctx.Done():
			var left []string
			for _, p := range pods {
				left = append(left, p.Namespace+"/"+p.Name)
			}
			return fmt.Errorf("node %s was not drained within %s: %s still there (a PodDisruptionBudget may forbid their eviction: 'kubectl get pdb -A')", node, timeout, strings.Join(left, ", "))
		case <-time.After(2 * time.Second):
		}
	}
	return nil
}

func podsToEvict(ctx context.Context, client kubernetes.Interface, node string) ([]corev1.Pod, error) {
	list, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return nil, fmt.Errorf("list the pods on node %s: %w", node, err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
			continue
		}
		if c := metav1.GetControllerOf(&p); c != nil && c.Kind == "DaemonSet" {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}
