// Package drain moves a node's pods elsewhere through the API server's
// eviction API, as 'kubectl drain' does, so that PodDisruptionBudgets
// hold: for 'orrery node remove' and for a worker's Kubernetes upgrade.
package drain

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
)

// Pods lists the pods of node that a drain evicts: not those of
// DaemonSets (which tolerate the cordon and would come back), nor static
// pods (the node's own), nor those that have finished.
func Pods(ctx context.Context, client kubernetes.Interface, node string) ([]corev1.Pod, error) {
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

// Drain evicts the Pods of node, and asks again for those a
// PodDisruptionBudget keeps for now, until every one is gone or timeout
// has passed; it returns those left then. say gets a line for what the
// owner should know: a pod no controller makes again, a budget that
// holds one. The node must be cordoned already, or the pods may come
// back.
func Drain(ctx context.Context, client kubernetes.Interface, node string, timeout time.Duration, say func(string, ...any)) ([]corev1.Pod, error) {
	pods, err := Pods(ctx, client, node)
	if err != nil {
		return nil, err
	}
	for _, p := range pods {
		if metav1.GetControllerOf(&p) == nil {
			say("evicting pod %s/%s, which no controller makes again: it is gone for good", p.Namespace, p.Name)
		}
	}
	deadline := time.Now().Add(timeout)
	lastHeld := ""
	for len(pods) > 0 {
		var held []string
		for _, p := range pods {
			err := client.PolicyV1().Evictions(p.Namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
			switch {
			case err == nil || apierrors.IsNotFound(err):
			case apierrors.IsTooManyRequests(err):
				held = append(held, p.Namespace+"/"+p.Name)
			default:
				return pods, fmt.Errorf("evict pod %s/%s from node %s: %w", p.Namespace, p.Name, node, err)
			}
		}
		if pods, err = Pods(ctx, client, node); err != nil || len(pods) == 0 {
			return pods, err
		}
		if time.Now().After(deadline) {
			return pods, nil
		}
		if h := strings.Join(held, ", "); h != "" && h != lastHeld {
			say("waiting: a PodDisruptionBudget keeps %s on %s for now", h, node)
			lastHeld = h
		}
		select {
		case <-ctx.Done():
			return pods, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	return nil, nil
}

// Names are pods' namespace/name, for messages.
func Names(pods []corev1.Pod) string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Namespace+"/"+p.Name)
	}
	return strings.Join(out, ", ")
}
